"""Published digests (issue 40, item 2): the README's shipped pipeline, run on whatever CPU runs this
test, gives exactly the tensor digests and metric values committed in ``published-digests.json`` and
shown in the README. They were measured on another machine (the file names it), so every run of this
test is a cross-hardware check. ``marin reference check`` needs no ledger, and one ulp in one weight
is named."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import rfc8785
from safetensors.numpy import load_file, save_file

from tests.conftest import REPO, Project, copy_project

pytestmark = pytest.mark.slow


def _tree_digest(tensors: dict[str, np.ndarray]) -> str:
    """The tensor digest, computed here (length-prefixed canonical header and raw bytes per sorted name)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        a = tensors[name]
        header = rfc8785.dumps({"path": name, "dtype": str(a.dtype), "shape": list(a.shape)})
        data = a.tobytes()
        h.update(len(header).to_bytes(8, "big") + header + len(data).to_bytes(8, "big") + data)
    return "sha256:" + h.hexdigest()


def _flat(obj: object, prefix: str = "") -> dict[str, object]:
    if not isinstance(obj, dict):
        return {prefix: obj}
    return {k: v for key, val in obj.items() for k, v in _flat(val, f"{prefix}.{key}" if prefix else key).items()}


@pytest.fixture
def shipped(_shipped, tmp_path: Path) -> Project:
    """A copy of the session's shipped `dvc repro`, without its ledger: the check must not need it."""
    proj = copy_project(_shipped[0], tmp_path / "proj")
    shutil.rmtree(proj.root / "ledger")
    return proj


def test_the_shipped_pipeline_gives_the_published_digests_without_a_ledger(shipped: Project) -> None:
    pub = json.loads((REPO / "published-digests.json").read_text())
    r = shipped.marin("reference", "check")
    assert r.returncode == 0, r.stdout + r.stderr
    # independently of marin's reader: the weights hashed here, the metrics read here
    for m in ("models/final", "models/instruct"):
        assert _tree_digest(load_file(shipped.root / m / "model.safetensors")) == pub["models"][m], m
    flat = {**_flat(json.loads((shipped.root / "metrics/eval.json").read_text())),
            **_flat(json.loads((shipped.root / "evals/eval_context.json").read_text()))}  # measurements, the rest
    assert {k: v.hex() if isinstance(v, float) else v for k, v in flat.items()} == pub["metrics"]
    # the README publishes the same two digests, with the command
    readme = (REPO / "README.md").read_text()
    for m in ("models/final", "models/instruct"):
        assert re.search(rf"`{m}`[^\n]*`{pub['models'][m]}`", readme), m
    assert "uv run marin reference check" in readme


def test_one_ulp_in_one_weight_is_named(shipped: Project) -> None:
    path = shipped.root / "models/final/model.safetensors"
    tensors = load_file(path)
    name = sorted(tensors)[0]
    flat = tensors[name].reshape(-1)
    flat[0] = np.nextafter(flat[0], np.float32(np.inf), dtype=flat.dtype)
    save_file(tensors, path)
    r = shipped.marin("reference", "check")
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 1 and lines[0].startswith("reference: DIFFERS tensor digest of models/final: published ")
    assert len(lines) == 2 and lines[-1].startswith("reference: 1 of "), r.stdout


def test_other_params_are_refused_in_one_line(shipped: Project) -> None:
    params = shipped.params
    params["train"]["steps"] += 1
    shipped.write_params(params)
    r = shipped.marin("reference", "check")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "params.yaml" in r.stderr, r.stderr
