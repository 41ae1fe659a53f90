"""The Hugging Face export (stage export, models/hf/) loaded by the real ``transformers`` on
CPU PyTorch: logits equal the JAX model's on the validation windows, the tokenizer gives the
project tokenizer's ids, greedy generation repeats the evaluate stage's recorded samples.

torch and transformers come from the ``hf`` dependency group, which the README's test
command installs (``uv sync --frozen --group hf``): without them these tests fail, saying so."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import numpy as np
import pytest

from marin.export import hf
from tests.conftest import Project

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

    from marin.train import weights

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
    for text in texts:
        assert tok(text)["input_ids"] == project.encode(text).ids
        assert tok.decode(tok(text)["input_ids"]) == text

    # greedy generation: the evaluate stage's recorded samples, while they fit the context
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    seq_len = exported.params["model"]["seq_len"]
    ev = next(json.loads(line) for f in (exported.root / "ledger/runs").glob("evaluate-*.jsonl")
              for line in f.read_text().splitlines() if '"greedy_samples"' in line)
    for s in ev["body"]["samples"]:
        prompt = [tok.eos_token_id, *tok(s["prompt"])["input_ids"]]
        n = min(seq_len - len(prompt), len(s["token_ids"]))
        assert n > 0
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
        assert out[0, len(prompt):].tolist()[:n] == s["token_ids"][:n]


def test_every_marin_tensor_gets_one_llama_name() -> None:
    model = {"n_layers": 1, "tie_embeddings": False}
    src = {k: np.ones((2, 3), np.float32) for k in (
        "embed.embedding", "final_norm.scale", "lm_head.kernel", "blocks.0.attn_norm.scale", "blocks.0.mlp_norm.scale",
        *(f"blocks.0.attn.w{m}.kernel" for m in "qkvo"),
        *(f"blocks.0.mlp.w_{m}.kernel" for m in ("gate", "up", "down")))}
    out = hf.llama_tensors(src, model)
    assert len(out) == len(src) and out["lm_head.weight"].shape == (3, 2)  # Linear weights are (out, in)
    assert out["model.layers.0.self_attn.q_proj.weight"].shape == (3, 2)
    with pytest.raises(Exception, match=r"blocks.0.attn.wqkv.kernel.*no Llama name"):
        hf.llama_tensors({**src, "blocks.0.attn.wqkv.kernel": src["lm_head.kernel"]}, model)
