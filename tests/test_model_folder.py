"""marin.model_folder: a saved model folder reads, or is one IntegrityError naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from marin import hashing, model_folder
from marin.errors import IntegrityError


def _folder(tmp_path: Path) -> Path:
    d = tmp_path / "final"
    d.mkdir()
    tensors = {"embed.embedding": np.arange(12, dtype=np.float32).reshape(3, 4), "final_norm.scale": np.ones(4)}
    save_file(tensors, str(d / "model.safetensors"))
    digest = hashing.tree_digest(tensors)
    (d / "config.json").write_text(json.dumps({"weights": "model.safetensors", "tensor_digest": digest}))
    return d


def test_a_saved_folder_reads_with_its_recorded_digest(tmp_path: Path) -> None:
    tensors, config = model_folder.read(_folder(tmp_path))
    assert sorted(tensors) == ["embed.embedding", "final_norm.scale"] and tensors["embed.embedding"][2, 3] == 11
    assert config["tensor_digest"] == hashing.tree_digest(tensors)


@pytest.mark.parametrize("damage, file, why", [
    ("config_not_json", "config.json", "not a readable model config"),
    ("config_not_ours", "config.json", "not a marin model config"),
    ("weights_cut", "model.safetensors", "not a readable safetensors file"),
    ("weights_missing", "model.safetensors", "missing (named by config.json)"),
    ("tensor_flipped", "model.safetensors", "tensors hash to"),
])
def test_a_damaged_folder_is_one_line_naming_the_file(tmp_path: Path, damage: str, file: str, why: str) -> None:
    d = _folder(tmp_path)
    weights = d / "model.safetensors"
    if damage == "config_not_json":
        (d / "config.json").write_text('{"d_model": ')
    elif damage == "config_not_ours":
        (d / "config.json").write_text("[1, 2]")
    elif damage == "weights_cut":
        weights.write_bytes(weights.read_bytes()[:20])
    elif damage == "weights_missing":
        weights.unlink()
    else:
        data = bytearray(weights.read_bytes())
        data[-1] ^= 1  # the last byte of the last tensor
        weights.write_bytes(bytes(data))
    with pytest.raises(IntegrityError) as e:
        model_folder.read(d)
    msg = str(e.value)
    assert msg.startswith(f"{d / file}: ") and why in msg and "dvc checkout" in msg and "\n" not in msg


@pytest.mark.parametrize("weights, why", [
    ("/etc/hostname", "is not a file of the model folder"),
    ("../elsewhere.safetensors", "is not a file of the model folder"),
    ("fifo", "is a fifo, not a weights file"),
])
def test_weights_outside_the_folder_or_not_a_file_are_refused_at_once(tmp_path: Path, weights: str,
                                                                      why: str) -> None:
    """A config.json naming an absolute path, a `..` path or a fifo: one line, never a loader blocked."""
    import os

    d = _folder(tmp_path)
    os.mkfifo(d / "fifo")
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "weights": weights}))
    with pytest.raises(IntegrityError) as e:
        model_folder.read(d)
    msg = str(e.value)
    assert why in msg and "dvc checkout" in msg and "\n" not in msg, msg
