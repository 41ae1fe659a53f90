"""Stage reference_<name>: a Hugging Face model folder that ``evaluate.references`` lists, scored beside
ours. lm-eval's own ``hf`` model (:class:`lm_eval.models.huggingface.HFLM`, CPU, float32) runs exactly
the evaluate stage's requests (the same tasks, limit, seeds, shots and decontamination), recorded as
``harness:<task>`` eval records like evaluate's; then bits per byte of the validation text with the
model's own tokenizer (``model`` records, whole and per corpus), and what the model's card states of
its parameters and training tokens (a ``card`` record). Writes metrics/reference/<name>.json (its measurements) and
evals/reference/<name>.json (the rest: :mod:`marin.evaluate.metrics_file`).

The folder is checked before it is hashed or loaded (:mod:`marin.evaluate.reference_folder`: regular
files only, safetensors weights only, no remote code, each header bounded and checked), then pinned by
its tree digest (:func:`marin.hashing.dir_digest`, links refused) like a corpus, and is the run's
``model`` input: one changed byte makes ``dvc status`` name this stage only. All of it happens before
torch is imported, so a refused folder costs a second, not the minute torch and transformers take.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from marin import hashing, readers, stages
from marin.config import Params, Reference
from marin.env_types import DeterminismClass
from marin.errors import MarinError, StageError
from marin.evaluate import decontam, metrics_file, reference_folder
from marin.fsutil import shown
from marin.stages import task_files

if TYPE_CHECKING:
    from marin.ledger import Run
    from marin.ledger.bodies import EvalBody

NOT_STATED = "not stated"
# Where a card states a model's size: keys of README.md's YAML metadata, then of config.json
PARAMETER_KEYS = ("parameters", "num_parameters", "n_params", "params")
TOKEN_KEYS = ("training_tokens", "train_tokens", "tokens_seen", "num_tokens")


def find(params: Params, name: str) -> Reference:
    """The reference ``name`` of params.yaml; a StageError when it lists none by that name."""
    for ref in params.evaluate.references:
        if ref.name == name:
            return ref
    raise StageError(f"evaluate.references lists no model {name!r}; run `marin stages --write` after editing "
                     "params.yaml")


def check_pin(root: Path, ref: Reference) -> str:
    """The folder (project-relative), once it is a project folder of plain files that transformers can load
    without running code (:func:`reference_folder.check`) whose tree digest is the pinned one."""
    where = f"evaluate.references {ref.name}"
    rel = task_files.inside(root, ref.path, where)
    if not (root / rel).is_dir():
        raise StageError(f"{where}: {rel} is not a folder; put the model's files there (docs/guide/harness.md)")
    reference_folder.check(root / rel, where)
    found = hashing.dir_digest(root / rel, links=False).removeprefix(hashing.PREFIX)
    if found != ref.sha256:
        raise StageError(f"evaluate.references {ref.name}: {rel} has sha256 {found}, params.yaml pins {ref.sha256}; "
                         "if you replaced its files on purpose, pin the new digest")
    return rel


def card_facts(folder: Path) -> dict[str, Any]:
    """The parameters and training tokens the folder's card states (README.md's YAML metadata, else
    config.json), each an integer or ``"not stated"``."""
    import yaml

    meta: dict[str, Any] = {}
    readme = folder / "README.md"
    if readme.is_file():
        text = readers.read_text(readme, "text", StageError)
        if text.startswith("---"):
            head = text.split("---", 2)[1] if text.count("---") >= 2 else ""
            try:
                loaded = yaml.safe_load(head) or {}
            except (yaml.YAMLError, RecursionError) as e:
                said = (str(e).splitlines() or [type(e).__name__])[0]
                raise StageError(f"{shown(readme)}: its YAML metadata does not parse ({said}); fix the card's "
                                 "front matter") from None
            meta = loaded if isinstance(loaded, dict) else {}
    config = readers.read_json(folder / "config.json", "config", StageError) if (folder / "config.json").is_file() \
        else {}
    out = {}
    for fact, keys in (("parameters", PARAMETER_KEYS), ("training_tokens", TOKEN_KEYS)):
        found = [src[k] for src in (meta, config) if isinstance(src, dict) for k in keys if k in src]
        ok = [int(v) for v in found if isinstance(v, int | float) and not isinstance(v, bool) and v > 0]
        out[fact] = ok[0] if ok else NOT_STATED
    return out


def run_stage(root: Path, params: Params) -> None:
    """Score the reference the running stage names (``reference_<name>``) on evaluate's requests and the
    validation text (its input ``text``: evaluate scores its tokens), as a ledger run."""
    stage = stages.current()
    name, validation, evalsets = stage.args, stage.input("text"), stage.input("evalsets")
    ref = find(params, name)
    folder = check_pin(root, ref)  # before torch is imported: a refused folder costs a second
    card = card_facts(root / folder)
    import torch

    from marin import env
    from marin.evaluate import harness_run
    from marin.ledger import Input, Recipe, Run

    hp = params.evaluate.harness
    inputs = [Input("model", folder, license=ref.license), Input("text", validation.as_posix())]
    if (root / evalsets).is_dir():
        inputs.append(Input("evalsets", evalsets.as_posix()))
    inputs += [Input(f"task:{p}", p) for p in task_files.listed_paths(root, hp, f"reference_{name}")]
    decon = decontam.load(root, params.evaluate.decontaminate)
    if decon is not None:
        inputs.append(Input("decontamination", decontam.OUT.as_posix()))
    fp = env.fingerprint()
    det: DeterminismClass = {"kind": "torch", "torch": torch.__version__, "device": "cpu", "dtype": "float32",
           "threads": torch.get_num_threads(), "machine": fp["machine"]}
    recorded = {"evaluate": {"harness": params.section("evaluate")["evaluate"].get("harness", {}),
                             "decontaminate": params.evaluate.decontaminate},
                "reference": {"name": ref.name, "path": ref.path, "sha256": ref.sha256, "license": ref.license}}
    with Run.start(root, Recipe(stage.name, recorded, inputs, closure=stages.code_files(root, stage.name),
                                     det_class=det, fingerprint=fp)) as run:
        lm = hf_model(root, folder, hp.batch_size)
        harness = harness_run.run_tasks(root, hp, lm, lambda body: run.record("eval", body), decon=decon)
        tallies = _bits_per_byte(root / validation, lm, run)
        run.record("eval", {"name": "card", "split": "card", "values": {**card, "license": ref.license}})
        metrics = {"bits_per_byte": tallies[""].bits_per_byte, **card,
                   "per_corpus": {c: t.bits_per_byte for c, t in sorted(tallies.items()) if c},
                   "harness": {t: {k: v for k, v in vals.items() if isinstance(v, int | float)}
                               for t, vals in harness.items() if "error" not in vals}}
        metrics_file.write(root, run, metrics, ("reference_metrics", stage.out("reference_metrics")),
                           ("reference_context", stage.out("reference_context")), metrics_file.evaluation_headline)
        for task, vals in harness.items():
            if "error" not in vals:
                print(f"reference {name}: harness {task}: " + ", ".join(
                    f"{k} {v:.4f}" for k, v in sorted(vals.items()) if isinstance(v, float) and "/" not in k))
        print(f"reference {name}: validation bits/byte {tallies[''].bits_per_byte:.4f} (its own tokenizer); "
              f"parameters {card['parameters']}, training tokens {card['training_tokens']} (its card)")


def hf_model(root: Path, folder: str, batch_size: int) -> Any:
    """lm-eval's ``hf`` model on the folder: CPU, float32, its defaults otherwise (what
    ``lm_eval --model hf --model_args pretrained=<folder>,dtype=float32 --device cpu`` builds)."""
    from lm_eval.models.huggingface import HFLM as Built

    from marin.evaluate import harness_run

    hflm: Any = Built  # lm-eval's decorated constructor confuses type checkers
    with harness_run.offline(root):
        try:
            return hflm(pretrained=str(root / folder), device="cpu", dtype="float32", batch_size=batch_size)
        except MarinError:
            raise
        except Exception as e:  # whatever transformers refuses after the checks, said in one line
            said = (str(e).strip().splitlines() or [""])[0][:300]
            raise StageError(f"{folder}: transformers cannot load it ({type(e).__name__}: {said}); "
                             "check the folder's config.json and weights") from None


def _bits_per_byte(validation: Path, lm: Any, run: Run) -> dict[str, Any]:
    """Each validation document scored by the model with its own tokenizer (:func:`doc_nll`), tallied
    whole (key ``""``) and per corpus; one ``model`` eval record each."""
    import pyarrow.parquet as pq

    from marin.evaluate.scoring import Tally
    from marin.ledger import exact

    tallies: dict[str, Tally] = {}
    start = lm.tokenizer.bos_token_id if lm.tokenizer.bos_token_id is not None else lm.tokenizer.eos_token_id
    for b in pq.ParquetFile(validation).iter_batches(batch_size=64, columns=["text", "corpus"]):
        for text, corpus in zip(b.column("text").to_pylist(), b.column("corpus").to_pylist(), strict=True):
            ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
            nll = doc_nll(lm.model, [start, *ids], lm.max_length)
            for key in ("", corpus):
                tallies.setdefault(key, Tally()).add(nll, len(ids), len(text.encode("utf-8")))
    for corpus, t in sorted(tallies.items()):
        body: EvalBody = {"name": "model", "split": "validation", "values": {
            "bits_per_byte": exact(t.bits_per_byte), "perplexity": exact(t.perplexity), "nll_nats": exact(t.nll_nats),
            "tokens": t.tokens, "bytes": t.bytes, "docs": t.docs}}
        if corpus:
            body["corpus"] = corpus
        run.record("eval", body)
    return tallies


def doc_nll(model: Any, seq: list[int], max_len: int) -> float:
    """The summed negative log-likelihood (nats) of ``seq[1:]``, each token predicted once, from at
    most ``max_len`` tokens of its own document (the windows of :func:`marin.data.documents.windows`)."""
    import torch

    total = 0.0
    with torch.no_grad():
        for j in range(0, len(seq) - 1, max_len):
            y = seq[j + 1: j + max_len + 1]
            x = torch.tensor([seq[j: j + len(y)]])
            logp = torch.log_softmax(model(x).logits[0].float(), dim=-1)
            total -= float(logp[torch.arange(len(y)), torch.tensor(y)].double().sum())
    return total
