"""The Hugging Face export (stage export, models/hf/) loaded by the real ``transformers`` on
CPU PyTorch: logits equal the JAX model's on the validation windows, the tokenizer gives the
project tokenizer's ids, greedy generation repeats the evaluate stage's recorded samples.

torch and transformers come from the ``hf`` dependency group, which the README's test
command installs (``uv sync --frozen --group hf``): without them these tests fail, saying so."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import Project, evaluation

HF = Path("models/hf")


def _hf_libs():
    try:
        import torch
        import transformers
    except ImportError as e:  # never a skip: a missing group would hide the export's only check
        pytest.fail(f"{e}: the export tests need the hf dependency group; run `uv sync --frozen --group hf` "
                    "(the README's test command does)")
    return torch, transformers


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, _trained_project: Project) -> Project:
    from tests.conftest import copy_project

    proj = copy_project(_trained_project, tmp_path_factory.mktemp("export") / "proj")
    r = proj.stage("export")
    assert "export: wrote models/hf/" in r.stdout
    return proj


def _validation_windows(proj: Project, n: int) -> tuple[np.ndarray, int]:
    """The first ``n`` evaluation windows of the validation documents (marin.data.documents' windows,
    a document's last one padded with EOS)."""
    from marin.data.documents import documents, windows

    tm = json.loads((proj.root / "data/tokens/manifest.json").read_text())
    shards = [proj.root / "data/tokens" / s["file"] for s in tm["splits"]["validation"]["shards"]]
    seq_len = proj.params["model"]["seq_len"]
    rows = []
    for ids, _, _ in documents(shards):
        rows += [x for x, _, _ in windows(ids, tm["tokenizer"]["eos_id"], seq_len)]
        if len(rows) >= n:
            break
    return np.stack(rows[:n]), tm["tokenizer"]["eos_id"]


@pytest.mark.slow
def test_transformers_loads_the_export_with_the_jax_models_logits(exported: Project) -> None:
    torch, transformers = _hf_libs()
    from flax import nnx

    from marin.model import weights

    path = exported.root / HF
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.model_type == "llama"
    # the Llama tensor names: exactly those of a LlamaForCausalLM built from the config by transformers
    from safetensors.numpy import load_file

    stored = set(load_file(str(path / "model.safetensors")))
    fresh = transformers.LlamaForCausalLM(model.config).state_dict()
    assert stored == {k for k in fresh if not (model.config.tie_word_embeddings and k == "lm_head.weight")}
    for f in path.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f

    x, _ = _validation_windows(exported, 64)  # every validation window of the mini corpus (it has 5)
    assert len(x) >= 4
    graphdef, params, _ = weights.load(exported.root / "models/final")
    jax_logits = np.asarray(nnx.merge(graphdef, params)(x))
    with torch.no_grad():
        hf_logits = model(torch.from_numpy(x.astype(np.int64))).logits.numpy()
    assert hf_logits.shape == jax_logits.shape
    assert np.abs(hf_logits - jax_logits).max() <= 1e-4


@pytest.mark.slow
def test_the_exported_tokenizer_and_generation_match_the_project(exported: Project) -> None:
    torch, transformers = _hf_libs()
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    path = exported.root / HF
    tok = transformers.AutoTokenizer.from_pretrained(path)
    project = Tokenizer.from_file(str(exported.root / "data/tokens/tokenizer.json"))
    texts = pq.read_table(exported.root / "data/curated/validation.parquet", columns=["text"])["text"].to_pylist()
    assert texts
    for text in texts:  # every text starts with the end-of-text token, as every training document did
        assert tok(text)["input_ids"] == [tok.eos_token_id, *project.encode(text).ids]
        assert tok(text, add_special_tokens=False)["input_ids"] == project.encode(text).ids
        assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text
    assert tok.bos_token_id == tok.eos_token_id == project.token_to_id("<|endoftext|>")

    # greedy generation: the evaluate stage's recorded samples, while they fit the context
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    seq_len = exported.params["model"]["seq_len"]
    ev = next(json.loads(line) for f in (exported.root / "ledger/runs").glob("evaluate-*.jsonl")
              for line in f.read_text().splitlines() if '"greedy_samples"' in line)
    for s in ev["body"]["samples"]:
        prompt = tok(s["prompt"])["input_ids"]  # the BOS (end-of-text) first, as the evaluate stage prompts
        assert prompt[0] == tok.eos_token_id and prompt[1:] == project.encode(s["prompt"]).ids
        n = min(seq_len - len(prompt), len(s["token_ids"]))
        assert n > 0
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
        assert out[0, len(prompt):].tolist()[:n] == s["token_ids"][:n]


def _python_block(text: str, after: str) -> str:
    """The first ```python block after the line containing ``after``."""
    rest = text[text.index(after):]
    return rest.split("```python\n", 1)[1].split("```", 1)[0]


def _greedy_sample(proj: Project) -> dict:
    return next(json.loads(line)["body"]["samples"][0] for f in (proj.root / "ledger/runs").glob("evaluate-*.jsonl")
                for line in f.read_text().splitlines() if '"greedy_samples"' in line)


@pytest.mark.slow
def test_the_export_is_a_hub_ready_folder_with_its_model_card(exported: Project) -> None:
    _, transformers = _hf_libs()
    from huggingface_hub import ModelCard
    from huggingface_hub.hf_api import DEFAULT_IGNORE_PATTERNS
    from huggingface_hub.repocard_data import model_index_to_eval_results
    from huggingface_hub.utils import filter_repo_objects

    path = exported.root / HF
    files = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
    assert list(filter_repo_objects(files, ignore_patterns=DEFAULT_IGNORE_PATTERNS)) == files  # all of it goes
    assert "README.md" in files and "generation_config.json" in files

    card = ModelCard.load(path / "README.md")
    data = card.data.to_dict()
    params = exported.params
    assert data["license"] == params["report"]["license"].lower() and data["language"] == ["en"]
    assert "datasets" not in data  # no source names a Hub dataset: none made up
    for heading in ("How to use", "Uses", "Bias, risks and limitations", "Training data", "Training details",
                    "Evaluation", "Environmental impact", "Licence and citation"):
        assert f"\n## {heading}\n" in card.text, heading
    [train] = exported.runs("train")
    assert f"Training run `{train[0]['run_id']}` (stage `train`" in card.text
    assert f"| `lr` | {train[0]['body']['params']['train']['lr']} |" in card.text
    steps = sorted({r["body"]["step"] for r in train if r["kind"] == "checkpoint"})  # the revisions, listed
    assert len(steps) > 1 and ", ".join(f"`step{s}`" for s in steps) + "." in card.text
    hours = train[-1]["body"]["wall_s"] * len(train[0]["body"]["env"]["usable_cores"]) / 3600
    assert f"{hours:.4f} CPU-hours" in card.text
    assert {"marin", "llama"} <= set(data["tags"]) and data["library_name"] == "transformers"
    assert "base_model" not in data  # trained from scratch
    _, results = model_index_to_eval_results(data["model-index"])
    ev = evaluation(exported.root)  # the metrics file and its context file (the perplexity is there)
    got = {(r.dataset_config, r.metric_type): r.metric_value for r in results}
    assert got[("all", "bits_per_byte")] == ev["bits_per_byte"] and got[("all", "perplexity")] == ev["perplexity"]
    assert "report.md#F" not in card.text and "hf upload <your-name>/" in card.text
    _check_benchmarks(exported.root, card.text)

    config = json.loads((path / "config.json").read_text())
    assert config["transformers_version"] == transformers.__version__  # the hf group's pin, as the Hub reads it
    gen = transformers.GenerationConfig.from_pretrained(path)
    assert gen.eos_token_id == config["eos_token_id"]
    assert config["max_position_embeddings"] == params["model"]["seq_len"]  # generate stops at the context
    assert "max_length" not in json.loads((path / "generation_config.json").read_text())  # generate would warn
    tok = transformers.AutoTokenizer.from_pretrained(path)
    assert tok.padding_side == "left" and tok.model_max_length == params["model"]["seq_len"]


def _check_benchmarks(root: Path, text: str) -> None:
    """The uploaded card's Benchmarks table against metrics/eval.json and evals/eval_context.json, each read
    here: every task and metric, its baselines, stderr, clean-subset score and samples (issue 57: the table
    was only in the report's card)."""
    section = text[text.index("### Benchmarks (lm-evaluation-harness)"):].split("\n\n")[2].splitlines()
    assert section[0] == ("| task | metric | chance | unigram baseline | constant answer | model | ± stderr | "
                          "against baseline | clean items | samples | shots |")  # the session's run decontaminated
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): [c.strip() for c in line.strip("|").split("|")]
            for line in section[2:]}
    head = json.loads((root / "metrics/eval.json").read_text())["harness"]
    rest = json.loads((root / "evals/eval_context.json").read_text())["harness"]
    shown = 0
    for task in head:
        vals = {**head[task], **rest[task]}
        for m in [k for k, v in vals.items() if isinstance(v, float) and "/" not in k and "stderr" not in k]:
            cells = rows.pop((f"`{task}`", m))
            want = [f"{vals[k]:.4f}" if k in vals else none for k, none in (
                (f"chance/{m}", "–"), (f"unigram/{m}", "n/a"), (f"constant/{m}", "n/a"), (m, ""), (f"{m}_stderr", ""))]
            assert cells[2:7] == want, (task, m, cells)
            assert cells[7].removeprefix("**").removesuffix("**") in (
                "better than baseline", "not distinguishable from baseline", "worse than baseline")
            if f"clean/{m}" in vals:  # the score on the clean items, and how many were contaminated
                assert cells[8] == f"{vals[f'clean/{m}']:.4f} ({vals['contaminated']} contaminated)", cells
                shown += 1
            assert cells[9] == f"{vals['samples']} of {vals['items']}" and cells[10] == str(vals["num_fewshot"])
    assert not rows and shown  # one row per task and metric, nothing else; clean-subset scores among them


def _upload_set(folder: Path) -> list[str]:
    """What ``huggingface_hub.upload_folder(folder_path=folder)`` sends, computed as it does (its
    ``_prepare_upload_folder_additions``: every file under ``**/*``, filtered by the default ignores)."""
    from huggingface_hub.hf_api import DEFAULT_IGNORE_PATTERNS
    from huggingface_hub.utils import filter_repo_objects

    rel = [p.relative_to(folder).as_posix() for p in sorted(folder.resolve().glob("**/*")) if p.is_file()]
    return list(filter_repo_objects(rel, ignore_patterns=DEFAULT_IGNORE_PATTERNS))


def test_publish_hf_folder_writes_exactly_what_upload_folder_sends(exported: Project, tmp_path: Path) -> None:
    out = tmp_path / "hub"
    r = exported.marin("publish", "--hf-folder", str(out))
    assert r.returncode == 0, r.stderr
    everything = sorted(os.path.relpath(os.path.join(d, n), out) for d, dirs, names in os.walk(out) for n in names)
    assert everything == sorted(_upload_set(out)) == sorted(_upload_set(exported.root / HF))  # nothing held back
    assert not any((out / n).is_symlink() for n in everything) and "README.md" in everything
    assert all((out / n).read_bytes() == (exported.root / HF / n).read_bytes() for n in everything)
    assert r.stdout.splitlines()[-1] == f"hf upload <your-name>/{exported.params['report']['model_name']} {out} ."

    again = exported.marin("publish", "--hf-folder", str(out))  # not into a folder in use
    assert again.returncode != 0 and len(again.stderr.strip().splitlines()) == 1
    assert "not an empty folder" in again.stderr
    junk = [exported.root / HF / ".git/HEAD", exported.root / HF / "notes.txt"]
    try:
        for j in junk:
            j.parent.mkdir(exist_ok=True)
            j.write_text("junk\n")
        bad = exported.marin("publish", "--hf-folder", str(tmp_path / "hub2"))
        assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        assert "models/hf: is not what any export run recorded" in bad.stderr and not (tmp_path / "hub2").exists()
    finally:
        for j in junk:
            j.unlink()
        (exported.root / HF / ".git").rmdir()


@contextlib.contextmanager
def _warnings() -> Iterator[list[str]]:
    """What transformers says while the block runs: its logger's warnings (it does not propagate) and Python's."""
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    keep, log = Keep(logging.WARNING), logging.getLogger("transformers")
    log.addHandler(keep)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield said
        said += [str(w.message) for w in caught]
    finally:
        log.removeHandler(keep)


@pytest.mark.slow
def test_batched_generation_with_left_padding_equals_each_prompt_alone(exported: Project) -> None:
    torch, transformers = _hf_libs()
    path = exported.root / HF
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    prompts = ["ROMEO.", "Of Man's first disobedience, and the fruit"]
    assert len({len(tok(p)["input_ids"]) for p in prompts}) == 2  # one is padded
    batch = tok(prompts, padding=True, return_tensors="pt")
    with torch.no_grad():
        together = model.generate(**batch, max_new_tokens=8, do_sample=False)
    width = batch["input_ids"].shape[1]
    for i, p in enumerate(prompts):
        alone = tok(p, return_tensors="pt")
        with torch.no_grad():
            one = model.generate(**alone, max_new_tokens=8, do_sample=False)
        assert together[i, width:].tolist() == one[0, alone["input_ids"].shape[1]:].tolist(), p


@pytest.mark.slow
def test_generate_with_max_new_tokens_warns_of_nothing(exported: Project) -> None:
    torch, transformers = _hf_libs()
    model = transformers.AutoModelForCausalLM.from_pretrained(exported.root / HF)
    one = transformers.AutoTokenizer.from_pretrained(exported.root / HF)("ROMEO.", return_tensors="pt")
    with torch.no_grad(), _warnings() as said:
        model.generate(**one, max_new_tokens=4, do_sample=False)  # within the context
    assert not said, said  # issue 57: max_length in generation_config.json made every such call warn
    with torch.no_grad(), pytest.warns(UserWarning, match="default `max_length`"):  # transformers' own nudge
        short = model.generate(**one, do_sample=False)  # without max_new_tokens: 20 new tokens, within the context
    assert short.shape[1] <= min(one["input_ids"].shape[1] + 20, model.config.max_position_embeddings)


@pytest.mark.slow
def test_the_cards_and_the_readmes_snippets_print_the_evaluate_stages_sample(exported: Project, capsys,
                                                                          monkeypatch) -> None:
    _hf_libs()
    from tests.conftest import REPO

    monkeypatch.chdir(exported.root)  # the snippets load "models/hf" from the project
    sample = _greedy_sample(exported)
    card = (exported.root / HF / "README.md").read_text()
    code = _python_block(card, "## How to use")
    n = int(code.split("max_new_tokens=")[1].split(",")[0])
    readme = _python_block((REPO / "docs/guide/transformers.md").read_text(), "this prints the greedy completion")
    assert "max_new_tokens=40" in readme  # the default sample length; the tiny model's context holds fewer
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(exported.root / HF)
    want = tok.decode(sample["token_ids"][:n])
    for snippet in (code, readme.replace("max_new_tokens=40", f"max_new_tokens={n}")):
        exec(compile(snippet, "snippet", "exec"), {})
        assert capsys.readouterr().out == want + "\n"
    pipe = _python_block(card, "gives the same")  # pipeline("text-generation"): the tokenizer's BOS, the same tokens
    assert "pipeline(\"text-generation\"" in pipe and f"max_new_tokens={n}" in pipe
    exec(compile(pipe, "pipeline snippet", "exec"), {})
    assert capsys.readouterr().out == tok.decode(sample["token_ids"][:n], skip_special_tokens=True) + "\n"
    assert 0 < n <= len(sample["token_ids"])


@pytest.mark.slow
def test_publish_revisions_writes_each_checkpoint_as_a_step_revision(exported: Project, tmp_path: Path) -> None:
    _, transformers = _hf_libs()
    from huggingface_hub import ModelCard
    from safetensors.numpy import load_file

    out = tmp_path / "hub"
    r = exported.marin("publish", "--hf-folder", str(out), "--revisions")
    assert r.returncode == 0, r.stderr
    dest = tmp_path / "hub-revisions"
    [train] = exported.runs("train")
    ckpts = [x["body"] for x in train if x["kind"] == "checkpoint"]
    entries = json.loads((dest / "revisions.json").read_text())
    assert [e["revision"] for e in entries] == [f"step{c['step']}" for c in ckpts] and len(ckpts) >= 2
    for e, c in zip(entries, ckpts, strict=True):  # each revision's tensor digest is the ledger's checkpoint's
        assert e["tensor_digest"] == c["params_digest"] and e["train_run"] == train[0]["run_id"]
        folder = dest / e["revision"]
        assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in (exported.root / HF).iterdir())
        assert load_file(str(folder / "model.safetensors")) is not None
        from safetensors import safe_open

        with safe_open(str(folder / "model.safetensors"), "np") as f:
            assert f.metadata()["marin_tensor_digest"] == c["params_digest"]
        assert ModelCard.load(folder / "README.md").data.model_name == exported.params["report"]["model_name"]
        assert f"hf upload <your-name>/marin-tiny {folder} . --revision {e['revision']}" in r.stdout
    # the last checkpoint is the released model: the same Llama tensors as the main revision
    last, main = load_file(str(dest / entries[-1]["revision"] / "model.safetensors")), load_file(
        str(exported.root / HF / "model.safetensors"))
    assert last.keys() == main.keys() and all(np.array_equal(last[k], main[k]) for k in main)
    first = load_file(str(dest / entries[0]["revision"] / "model.safetensors"))
    assert any(not np.array_equal(first[k], main[k]) for k in main)  # an earlier step: other weights
    assert transformers.AutoModelForCausalLM.from_pretrained(dest / entries[0]["revision"]) is not None
    again = exported.marin("publish", "--revisions")
    assert again.returncode != 0 and "--revisions goes with --hf-folder" in again.stderr


@pytest.mark.slow
def test_marin_verify_replays_the_export_bit_for_bit(exported: Project) -> None:
    """The card reads the train run's ledger file, an input of the export run: a replay, whose ledger starts
    empty, gets it back and writes the same folder (card and weights included)."""
    [run] = exported.runs("export")
    inputs = {r["body"]["name"]: r["body"]["path"] for r in run if r["kind"] == "input"}
    [train] = exported.runs("train")
    assert inputs["training_run"] == f"ledger/runs/{train[0]['run_id']}.jsonl"
    r = exported.marin("verify", run[0]["run_id"])
    assert r.returncode == 0 and "BIT-EXACT" in r.stdout, r.stdout + r.stderr
