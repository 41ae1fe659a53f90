"""The released model written: ``model.safetensors`` (deterministic bytes) + ``config.json``, from
a trained parameter tree that may be sharded over processes. Reading it back is
:func:`marin.model.weights.load`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
from safetensors.numpy import save as safetensors_bytes

from marin import fsutil, hashing
from marin.model import ModelConfig
from marin.model.weights import WEIGHTS, tensor_name
from marin.model_folder import CONFIG
from marin.train import distributed


def flat(params: Any) -> dict[str, np.ndarray]:
    """{dotted path: host array} of a parameter pytree."""
    return {tensor_name(p): distributed.host_array(x) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}


def params_digest(params: Any) -> str:
    return hashing.tree_digest(flat(params))


def save(directory: Path, params: Any, cfg: ModelConfig, extra: dict[str, Any]) -> str:
    """Write weights and config; returns the tensor digest."""
    tensors = flat(params)
    directory.mkdir(parents=True, exist_ok=True)
    # through fsutil: mode 0644 like every output (safetensors' own save_file leaves 0600 here)
    fsutil.write_bytes(directory / WEIGHTS, safetensors_bytes(tensors, metadata={"format": "marin"}))
    digest = hashing.tree_digest(tensors)
    config = {"architecture": "marin-decoder", "model": dataclasses.asdict(cfg),
              "weights": WEIGHTS, "tensor_digest": digest, **extra}
    fsutil.write_bytes(directory / CONFIG, (json.dumps(config, indent=2, sort_keys=True) + "\n").encode())
    return digest
