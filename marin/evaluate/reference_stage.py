"""Stage reference_<name>: a Hugging Face model folder that ``evaluate.references`` lists, scored beside
ours. lm-eval's own ``hf`` model (:class:`lm_eval.models.huggingface.HFLM`, CPU, float32) runs exactly
the evaluate stage's requests (the same tasks, limit, seeds, shots and decontamination), recorded as
``harness:<task>`` eval records like evaluate's; then bits per byte of the validation text with the
model's own tokenizer (``model`` records, whole and per corpus; batched as lm-eval batches, with its cost
in a ``cost`` record: :mod:`marin.evaluate.reference_scoring`), and the parameters and training tokens
that the model's card states, or, for a folder that is this project's own export, that its ledger states
(a ``card`` record). Writes metrics/reference/<name>.json (its measurements) and
evals/reference/<name>.json (the rest: :mod:`marin.evaluate.metrics_file`).

The folder is checked before it is hashed or loaded (:mod:`marin.evaluate.reference_folder`: regular
files only, safetensors weights only, no remote code, each header bounded and checked), then pinned by
its tree digest (:func:`marin.hashing.dir_digest`, links refused) like a corpus, and is the run's
``model`` input: one changed byte makes ``dvc status`` name this stage only. All of it happens before
torch is imported, so a refused folder costs a second, not the minute torch and transformers take.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from marin import hashing, readers, stages
from marin.config import Params, Reference
from marin.env_types import DeterminismClass
from marin.errors import MarinError, StageError
from marin.evaluate import decontam, metrics_file, reference_folder
from marin.evaluate import reference_agreement as agreement
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
    return {**out, "stated_by": "card"}


@dataclass(frozen=True)
class OwnExport:
    """A reference folder that is, byte for byte, this project's own export: what its ledger states of it
    (``facts``: parameters, training tokens, the runs that say so) and those runs' ledger files (``runs``, by
    input name: a replay, whose ledger starts empty, reads them again)."""

    facts: dict[str, Any]
    runs: dict[str, str]


def own_export(root: Path, sha256: str) -> OwnExport | None:
    """The export run whose ``hf_model`` output has the folder's tree digest, with the parameters its train
    run's ``model`` output counted and the token positions it trained on (steps x batch size x sequence
    length, as the export's card says: :mod:`marin.export.training`); None for any other folder."""
    from marin.export import training
    from marin.ledger.query import Ledger
    from marin.ledger.store import read_run

    with Ledger(root, sources=stages.SOURCE_STAGES, skip=("metric",)) as ledger:
        found = [log for log, body in ledger.producers_of(hashing.PREFIX + sha256)
                 if log.stage == "export" and log.status == "succeeded" and body.get("name") == "hf_model"]
        trained = [i["path"] for log in found[:1] for i in log.bodies("input") if i["name"] == "training_run"]
    if not trained or not (root / trained[0]).is_file():
        return None
    train = read_run(root / trained[0])
    model: dict[str, Any] = next((dict(b) for b in train.bodies("output") if b["name"] == "model"), {})
    n_params = (model.get("meta") or {}).get("n_params")
    seq_len = (train.params.get("model") or {}).get("seq_len")
    if not isinstance(n_params, int) or not isinstance(seq_len, int):
        return None
    tokens = training.training(root, Path(trained[0]), seq_len).tokens
    export_file = found[0].path.resolve().relative_to(root.resolve()).as_posix()
    return OwnExport({"parameters": n_params, "training_tokens": tokens, "stated_by": "ledger",
                      "export_run": found[0].run_id, "training_run": train.run_id},
                     {"export_run": export_file, "training_run": trained[0]})


def run_stage(root: Path, params: Params) -> None:
    """Score the reference the running stage names (``reference_<name>``) on evaluate's requests and the
    validation text (its input ``text``: evaluate scores its tokens), as a ledger run."""
    stage = stages.current()
    name, validation, evalsets = stage.args, stage.input("text"), stage.input("evalsets")
    ref = find(params, name)
    folder = check_pin(root, ref)  # before torch is imported: a refused folder costs a second
    ours = own_export(root, ref.sha256)
    card = card_facts(root / folder) if ours is None else ours.facts
    import torch

    from marin import env
    from marin.evaluate import harness_run
    from marin.evaluate import reference_scoring as rs
    from marin.ledger import Input, Recipe, Run
    from marin.progress import meter

    hp = params.evaluate.harness
    inputs = [Input("model", folder, license=ref.license), Input("text", validation.as_posix())]
    if (root / evalsets).is_dir():
        inputs.append(Input("evalsets", evalsets.as_posix()))
    inputs += [Input(f"task:{p}", p) for p in task_files.listed_paths(root, hp, f"reference_{name}")]
    inputs += [Input(k, v) for k, v in (ours.runs if ours else {}).items()]  # so that a replay reads them again
    same = agreement.same_weights(root, ours.facts["export_run"]) if ours else None  # evaluate of these weights
    if same is not None:
        inputs += [Input("evaluate_run", same.run_file), Input("evaluate_samples", same.samples)]
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
        cost = rs.Cost(hp.batch_size)
        rs.counted(lm, cost)
        with cost.measuring("harness", meter(f"reference {name}: harness", unit="request")):
            harness = harness_run.run_tasks(root, hp, lm, lambda body: run.record("eval", body), decon=decon,
                                            logs=(logs := {}))
        if same is not None:
            agreement.record(root, run, same, logs, f"reference {name}")
        rows = _rows(root / validation)
        with cost.measuring("validation", meter(f"reference {name}: validation text", rows, "doc")) as m:
            tallies = rs.bits_per_byte(root / validation, lm, cost, m)
        _record_tallies(run, tallies)
        run.record("eval", {"name": "card", "split": "card", "values": {**card, "license": ref.license}})
        ran = {t: v for t, v in harness.items() if "error" not in v}
        spent = cost.values(sum(int(v.get("samples", 0)) for v in ran.values()), rows)
        run.record("eval", {"name": "cost", "split": "cost", "values": dict(spent)})
        metrics = {"bits_per_byte": tallies[""].bits_per_byte, **card,
                   "per_corpus": {c: t.bits_per_byte for c, t in sorted(tallies.items()) if c},
                   "harness": {t: {k: v for k, v in vals.items() if isinstance(v, int | float)}
                               for t, vals in ran.items()}, "cost": spent}
        metrics_file.write(root, run, metrics, ("reference_metrics", stage.out("reference_metrics")),
                           ("reference_context", stage.out("reference_context")), metrics_file.evaluation_headline)
        for task, vals in ran.items():
            print(f"reference {name}: harness {task}: " + ", ".join(
                f"{k} {v:.4f}" for k, v in sorted(vals.items()) if isinstance(v, float) and "/" not in k))
        said = "its card" if ours is None else f"this project's export: its train run {ours.facts['training_run']}"
        print(f"reference {name}: validation bits/byte {tallies[''].bits_per_byte:.4f} (its own tokenizer); "
              f"parameters {card['parameters']}, training tokens {card['training_tokens']} ({said})")
        print(f"reference {name}: cost: {cost.line()}; batch size {hp.batch_size}")


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


def _rows(validation: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(validation).metadata.num_rows


def _record_tallies(run: Run, tallies: dict[str, Any]) -> None:
    """One ``model`` eval record per tally (whole, then each corpus)."""
    from marin.ledger import exact

    for corpus, t in sorted(tallies.items()):
        body: EvalBody = {"name": "model", "split": "validation", "values": {
            "bits_per_byte": exact(t.bits_per_byte), "perplexity": exact(t.perplexity), "nll_nats": exact(t.nll_nats),
            "tokens": t.tokens, "bytes": t.bytes, "docs": t.docs}}
        if corpus:
            body["corpus"] = corpus
        run.record("eval", body)
