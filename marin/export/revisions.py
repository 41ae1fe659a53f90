"""``marin publish --hf-folder OUT --revisions``: the intermediate checkpoints of the training run behind
``models/hf`` as Hugging Face Hub revisions, the way Pythia and OLMo publish theirs (a branch ``stepN``
per checkpoint). Each checkpoint becomes a folder ``OUT-revisions/step<N>/`` holding what an export holds
(Llama weights, config, tokenizer, a short card), its tensor digest checked against the one the ledger
recorded for that checkpoint and written into the weights' metadata and ``OUT-revisions/revisions.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from huggingface_hub import ModelCard, ModelCardData

from marin import fsutil, hashing, model_folder, readers, stages
from marin.data.tokenize import EOS
from marin.errors import IntegrityError
from marin.export import hf
from marin.export.card import hf_license, repo_id
from marin.export.hub_folder import HubFolderError, recorded_export
from marin.ledger.query import Ledger
from marin.ledger.store import RunLog, read_run

MODEL, TOKENIZER = stages.declaration("export").input("model"), stages.declaration("export").input("tokenizer")


def revisions_dir(out: Path) -> Path:
    """Where the revisions of the hub folder ``out`` go: beside it, so that ``out`` stays the main revision."""
    return out.parent / f"{out.name}-revisions"


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    """A restored parameter tree as marin's dotted tensor names (``marin.train.weights.flat``)."""
    out: dict[str, np.ndarray] = {}
    for k, v in tree.items():
        name = f"{prefix}.{k}" if prefix else str(k)
        out.update(_flat(v, name) if isinstance(v, dict) else {name: np.asarray(v)})
    return out


def checkpoint_tensors(path: Path, recorded: str) -> dict[str, np.ndarray]:
    """The model tensors of the orbax checkpoint at ``path``, checked against the ledger's ``recorded``
    params digest (the checkpoint record's ``params_digest``)."""
    import orbax.checkpoint as ocp

    state = ocp.StandardCheckpointer().restore((path / "state").resolve())
    tensors = _flat(state["params"])
    if (got := hashing.tree_digest(tensors)) != recorded:
        raise IntegrityError(f"{path}: the checkpoint's parameters hash to {got}, the ledger records {recorded}; "
                             "the checkpoint changed on disk: restore it (`marin verify` fetches published ones)")
    return tensors


def _train_log(root: Path, export_run: str) -> RunLog:
    """The training run behind the export run: the ledger file it recorded as its ``training_run`` input."""
    with Ledger(root, sources=stages.SOURCE_STAGES) as ledger:
        found = [i for i in ledger.runs[export_run].bodies("input") if i["name"] == "training_run"]
    if not found:
        raise HubFolderError(f"export run {export_run} records no training run (an export from before revisions); "
                             "rerun `dvc repro export`")
    return read_run(root / found[0]["path"])


def _card(meta: dict[str, Any], step: int, steps: int, digest: str, run_id: str) -> str:
    name = meta["model_name"]
    lic = hf_license(meta["license"])
    data = ModelCardData(license=lic, license_name=str(meta["license"]) if lic == "other" else None,
                         library_name="transformers", pipeline_tag="text-generation", model_name=name,
                         tags=["marin", "llama", "checkpoint"])
    where = f"`{repo_id(meta)}`" if repo_id(meta) else "the main revision"
    text = (f"# {name} at step {step}\n\nAn intermediate checkpoint of {name}: step {step} of {steps} of training run "
            f"`{run_id}`, tensor digest `{digest}` (the ledger's checkpoint record; sha256 over the tensors). "
            f"The full model card, with uses, limitations, training details and evaluation, is {where}'s README.md; "
            "this revision is for studying training dynamics, as Pythia's `stepN` branches are.\n")
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n{text}"))


def write_revisions(root: Path, out: Path, meta: dict[str, Any]) -> tuple[Path, list[dict[str, Any]]]:
    """One folder ``step<N>`` per checkpoint of the train run behind the recorded export, in
    :func:`revisions_dir` (new or empty), and ``revisions.json``. Returns the folder and its entries."""
    run_id, _ = recorded_export(root)
    log = _train_log(root, run_id)
    dest = revisions_dir(out)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise HubFolderError(f"{dest}: exists and is not an empty folder; give a new --hf-folder")
    config = model_folder.read_config(root / MODEL)
    tok = readers.read_bytes(root / TOKENIZER, "tokenizer", IntegrityError)
    if hashing.bytes_digest(tok) != config["tokenizer"]["digest"]:
        raise IntegrityError(f"{TOKENIZER}: is not the tokenizer the model was trained with; rerun `dvc repro`")
    entries = []
    steps = int(log.params["train"]["steps"])
    for b in log.bodies("checkpoint"):
        if (digest := b.get("params_digest")) is None:  # a run from before checkpoints recorded it
            raise HubFolderError(f"{b['path']}: the ledger records no parameter digest for this checkpoint, so its "
                                 "revision could not be checked; retrain (`dvc repro train`) to publish revisions")
        tensors = checkpoint_tensors(root / b["path"], digest)
        rev = f"step{b['step']}"
        files = hf.files(tensors, {**config, "step": b["step"]}, tok, EOS,
                         {"marin_tensor_digest": digest, "marin_step": str(b["step"])},
                         _card(meta, b["step"], steps, digest, log.run_id))
        (dest / rev).mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            fsutil.write_bytes(dest / rev / name, data)
        entries.append({"revision": rev, "step": b["step"], "tensor_digest": digest,
                        "checkpoint_digest": b["digest"], "checkpoint": b["path"], "train_run": log.run_id,
                        "folder_digest": hashing.path_digest(dest / rev)})
    dest.mkdir(parents=True, exist_ok=True)
    fsutil.write_bytes(dest / "revisions.json", (json.dumps(entries, indent=2) + "\n").encode())
    return dest, entries
