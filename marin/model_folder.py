"""A saved model folder (``models/final``, ``models/instruct``): ``config.json`` and the tensors it names
(``model.safetensors``), read and checked against the config's tensor digest. No JAX here: the export
stage and the train package both read through it.

A folder that does not read as one (a config that is not JSON or lacks its keys, a safetensors file cut
short or with a bad header, tensors whose digest is not the recorded one) is one IntegrityError naming
the file: the folder is restored (``dvc checkout``) or rebuilt by the stage that wrote it."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file

from marin import hashing, readers
from marin.errors import IntegrityError
from marin.fsutil import open_regular, shown

CONFIG = "config.json"
ADVICE = "restore it (dvc checkout) or rerun the stage that wrote it (dvc repro)"


def read_config(directory: Path) -> dict[str, Any]:
    """The folder's config.json, an object naming its weights file and their tensor digest."""
    path = directory / CONFIG
    try:
        config = json.loads(readers.read_bytes(path, "config", IntegrityError))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise IntegrityError(f"{shown(path)}: not a readable model config ({e}); {ADVICE}") from None
    if not isinstance(config, dict) or not all(isinstance(config.get(k), str) for k in ("weights", "tensor_digest")):
        raise IntegrityError(f"{shown(path)}: not a marin model config (no weights file and tensor digest); {ADVICE}")
    return config


def weights_path(directory: Path, config: dict[str, Any]) -> Path:
    """The weights file ``config`` names: a path inside ``directory`` (never absolute nor ``..``) to a
    regular file (a fifo would block the loader forever; a DVC checkout's link to its cache is followed)."""
    name = config["weights"]
    if not name or PurePosixPath(name).is_absolute() or Path(name).is_absolute() or ".." in PurePosixPath(name).parts:
        raise IntegrityError(f"{shown(directory / CONFIG)}: weights {name[:200]!r} is not a file of the model "
                             f"folder; {ADVICE}")
    path = directory / name
    try:
        open_regular(path, follow=True).close()
    except FileNotFoundError:
        raise IntegrityError(f"{shown(path)}: missing (named by {CONFIG}); {ADVICE}") from None
    except OSError as e:
        raise IntegrityError(f"{shown(path)}: {e.strerror or e}, not a weights file; {ADVICE}") from None
    return path


def load(path: Path) -> dict[str, np.ndarray]:
    """The tensors of the safetensors file ``path``; one IntegrityError naming it when it does not read as
    one (safetensors bounds its header; a dtype numpy lacks is a TypeError)."""
    try:
        return load_file(str(path))
    except (OSError, SafetensorError, TypeError, ValueError) as e:
        said = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise IntegrityError(f"{shown(path)}: not a readable safetensors file ({said}); {ADVICE}") from None


def read(directory: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(tensors by dotted name, config) of a saved model; the tensor digest is checked."""
    config = read_config(directory)
    path = weights_path(directory, config)
    tensors = load(path)
    digest = hashing.tree_digest(tensors)
    if digest != config["tensor_digest"]:
        raise IntegrityError(f"{shown(path)}: tensors hash to {digest}, {CONFIG} records {config['tensor_digest']}; "
                             f"{ADVICE}")
    return tensors, config
