"""``marin reference``: the published digests of the shipped pipeline, checked without the ledger.

``published-digests.json`` (committed beside params.yaml) holds, for the shipped ``params.yaml`` of
this commit, the tensor digests of ``models/final`` and ``models/instruct`` and every value of
``metrics/eval.json`` with its context file ``evals/eval_context.json`` (floats as ``float.hex``),
measured with ``dvc repro`` on the CPU it names. On any CPU of the portable class the same command
must give the same bits, so a stranger who ran ``dvc repro`` compares their outputs with ``marin
reference check``: the tensors are read from the safetensors files and hashed here
(:func:`marin.hashing.tree_digest`), the metrics read from the two files; nothing comes from the
ledger. A change that alters the bits on purpose rewrites the file
(``marin reference write``) in the same commit, with a line saying why.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

from marin import config, hashing, readers, schemas, stages
from marin.errors import IntegrityError, MarinError
from marin.fsutil import shown

FILE = "published-digests.json"
SCHEMA = "published-digests"  # schemas/published-digests.schema.json
MODELS = (stages.MODEL, stages.INSTRUCT)
METRICS = stages.declaration("evaluate").out("eval_metrics").as_posix()
CONTEXT = stages.declaration("evaluate").out("eval_context").as_posix()  # the metrics' baselines, counts, settings


class ReferenceError(MarinError):
    """The published digests cannot be compared (no file, other params)."""

    exit_code = 2


def measured(root: Path) -> dict[str, Any]:
    """What the project's outputs give now: the params digest, each model's tensor digest (hashed
    from its weights file) and each metric of metrics/eval.json (floats as hex)."""
    from marin import model_folder

    out: dict[str, Any] = {"params_digest": params_digest(root), "models": {}, "metrics": {}}
    for m in MODELS:
        folder = root / m
        path = model_folder.weights_path(folder, model_folder.read_config(folder))
        out["models"][m] = hashing.tree_digest(model_folder.load(path))
    from marin.evaluate import metrics_file

    doc = metrics_file.read(root, Path(METRICS), Path(CONTEXT), IntegrityError)
    out["metrics"] = {k: float(v).hex() if isinstance(v, float) else v for k, v in config.flatten(doc).items()}
    return out


def params_digest(root: Path) -> str:
    """The digest of params.yaml's values (canonical JSON): comments and layout do not count."""
    return hashing.json_digest(config.load(root / "params.yaml").raw)


def published(root: Path) -> dict[str, Any]:
    """The published digests, read as a regular file within its cap and valid against
    schemas/published-digests.schema.json (a stranger's clone supplies the file): else one line."""
    path = root / FILE
    try:
        doc = readers.read_json(path, "published", ReferenceError)
    except FileNotFoundError:
        raise ReferenceError(f"{shown(path)}: missing; this project publishes no reference digests") from None
    schemas.validate(doc, SCHEMA, shown(path), ReferenceError)
    return doc


def compare(pub: dict[str, Any], now: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(what, published, yours) for every value that differs, in the file's order."""
    rows = [(f"tensor digest of {m}", d, now["models"].get(m, "missing")) for m, d in pub["models"].items()]
    rows += [(f"{METRICS}: {k}", str(v), str(now["metrics"].get(k, "missing"))) for k, v in pub["metrics"].items()]
    rows += [(f"{METRICS}: {k}", "absent", str(v)) for k, v in now["metrics"].items() if k not in pub["metrics"]]
    return [r for r in rows if r[1] != r[2]]


def check(root: Path, say: Any = print) -> int:
    """0 when the outputs are the published ones; 1 naming each difference; a ReferenceError when the
    params are not the shipped ones (the digests say nothing about other params)."""
    pub = published(root)
    if (mine := params_digest(root)) != pub["params_digest"]:
        raise ReferenceError(f"params.yaml: its values hash to {mine}, the published digests are for "
                             f"{pub['params_digest']} (the shipped params of this commit); restore them to compare")
    diffs = compare(pub, measured(root))
    checked = len(pub["models"]) + len(pub["metrics"])
    if not diffs:
        say(f"reference: the {checked} published values hold ({', '.join(pub['models'])} and "
            f"{len(pub['metrics'])} metrics of {METRICS}); published from {pub['measured_on']}")
        return 0
    for what, want, got in diffs:
        say(f"reference: DIFFERS {what}: published {want}, yours {got}")
    say(f"reference: {len(diffs)} of {checked} values differ from the published ones ({pub['measured_on']})")
    return 1


def write(root: Path, why: str) -> Path:
    """Publish the project's current outputs as the reference (for maintainers, after a change that
    alters the bits on purpose; ``why`` is kept in the file)."""
    import datetime as dt

    from marin.cpu import model

    doc = {"about": "marin reference check: the outputs `dvc repro` gives for the shipped params.yaml",
           "measured_on": f"{model()} ({platform.machine()}), {dt.date.today().isoformat()}", "why": why,
           **measured(root)}
    schemas.validate(doc, SCHEMA, FILE, ReferenceError)  # never a file `check` would refuse
    path = root / FILE
    path.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    return path
