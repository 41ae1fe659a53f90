"""A reference model folder (``evaluate.references``), checked before it is hashed or loaded.

torch and transformers take 30-60 s and a gigabyte to import, and then refuse a hostile folder with a
traceback (a pickled ``pytorch_model.bin``, a config that asks for remote code, a fifo for weights, a
safetensors header that claims 2^62 bytes). So the folder is judged here first, from its files alone,
each problem one line naming the file and the field:

1. regular files and folders only (:func:`marin.filetree.tree_problem`): no link that could lead
   outside the project, no fifo, socket or device, nothing the digest would skip;
2. safetensors weights only: no pickle (``.bin``, ``.pt``, ``.ckpt`` ...) nor other framework's weights;
3. no remote code: no ``auto_map`` in the configs transformers reads, and a ``config.json`` that is an
   object naming its ``model_type``;
4. each ``.safetensors`` header (its length bounded before a byte of it is read) parsed and checked as
   the format states: known dtypes, shapes, and data offsets that tile the data exactly; a shard index
   names only ``.safetensors`` files of the folder.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from marin import readers
from marin.errors import StageError
from marin.filetree import tree_problem
from marin.fsutil import shown

HEADER_CAP = 16 << 20  # bytes of one safetensors header; a shard's is ~100 KB, safetensors' own cap is 100 MB
WEIGHTS = ".safetensors"
INDEX = "model.safetensors.index.json"
# weights in a format other than safetensors: pickles (which run code as they load) and other frameworks'
OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib", ".h5", ".msgpack", ".npy", ".npz",
                 ".gguf", ".onnx")
CONFIGS = ("config.json", "tokenizer_config.json", "generation_config.json", "preprocessor_config.json",
           "processor_config.json")  # what transformers reads that may ask for remote code (auto_map)
DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
              "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64, "C64": 64,
              "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}


class FolderError(StageError):
    """A reference folder that is not plain files of safetensors weights without remote code."""


def check(folder: Path, where: str) -> None:
    """FolderError (prefixed ``where``) unless ``folder`` passes steps 1-4 of the module's docstring."""
    bad = tree_problem(folder)
    if bad is not None:
        raise FolderError(f"{where}: {shown(folder / bad[0])} {bad[1]}; a reference folder holds its own regular "
                          "files only (nothing was hashed or loaded): put the file itself there, or remove it")
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    other = [p for p in files if p.suffix.lower() in OTHER_WEIGHTS]
    if other:
        raise FolderError(f"{where}: {shown(other[0])} is weights in a format other than safetensors (a pickle runs "
                          "code as it loads); keep model.safetensors only (convert it, or download *.safetensors)")
    for name in CONFIGS:
        if (folder / name).is_file():
            _config(folder / name, where, name == "config.json")
    if not (folder / "config.json").is_file():
        raise FolderError(f"{where}: {shown(folder / 'config.json')} is missing; a Hugging Face model folder "
                          "holds config.json")
    weights = [p for p in files if p.name.endswith(WEIGHTS)]
    if not weights:
        raise FolderError(f"{where}: {shown(folder)} holds no {WEIGHTS} file; download the model's safetensors "
                          "weights")
    for p in weights:
        header(p, where)
    if (folder / INDEX).is_file():
        _index(folder, where)


def _json(path: Path, where: str) -> Any:
    try:
        return readers.read_json(path, "model_config", FolderError)
    except FolderError as e:
        raise FolderError(f"{where}: {e}") from None


def _config(path: Path, where: str, model: bool) -> None:
    doc = _json(path, where)
    if not isinstance(doc, dict):
        raise FolderError(f"{where}: {shown(path)}: not a JSON object")
    if "auto_map" in doc:
        raise FolderError(f"{where}: {shown(path)}: auto_map asks for the model's own code, which is never run "
                          "here (no remote code); use a model that transformers supports without it")
    if model and not isinstance(doc.get("model_type"), str):
        raise FolderError(f"{where}: {shown(path)}: model_type is {_shown(doc.get('model_type'))}, not a name "
                          "transformers knows (a Hugging Face config names its model_type)")


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def header(path: Path, where: str) -> dict[str, Any]:
    """The safetensors header of ``path`` once it holds as the format states (length bounded before it is
    read, JSON, each tensor's dtype, shape and data offsets tiling the data); FolderError otherwise."""
    def bad(why: str) -> FolderError:
        return FolderError(f"{where}: {shown(path)}: {why}; not a safetensors file transformers could load: "
                           "download it again")

    with readers.opened(path, "weights", FolderError) as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 0:
            raise bad(f"only {size} of the 8 bytes that give its header's length")
        if n > HEADER_CAP:
            raise bad(f"header length {n:,} bytes, over the {HEADER_CAP:,}-byte cap")
        if n > size - 8:
            raise bad(f"header length {n:,} bytes, past the end of the file ({size:,} bytes)")
        raw = f.read(n)
    try:
        doc = json.loads(raw) if len(raw) == n and raw[:1] == b"{" else None
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        raise bad("header is not a JSON object")
    _tensors(doc, size - 8 - n, bad)
    return doc


def _tensors(doc: dict[str, Any], data: int, bad: Callable[[str], FolderError]) -> None:
    """Each entry a tensor (``__metadata__``: strings), the offsets tiling ``data`` bytes in order."""
    spans = []
    for name, info in doc.items():
        if name == "__metadata__":
            if not (isinstance(info, dict) and all(isinstance(v, str) for v in info.values())):
                raise bad("header __metadata__ is not an object of strings")
            continue
        if not isinstance(info, dict):
            raise bad(f"header tensor {_shown(name)} is not an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in DTYPE_BITS:
            raise bad(f"header tensor {_shown(name)}: dtype {_shown(dtype)} is not a safetensors dtype")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise bad(f"header tensor {_shown(name)}: shape {_shown(shape)} is not a list of sizes")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= data):
            raise bad(f"header tensor {_shown(name)}: data_offsets {_shown(offsets)} do not lie in its "
                      f"{data:,} data bytes")
        if math.prod(shape) * DTYPE_BITS[dtype] != 8 * (offsets[1] - offsets[0]):
            raise bad(f"header tensor {_shown(name)}: data_offsets {_shown(offsets)} do not hold shape "
                      f"{_shown(shape)} of {dtype}")
        spans.append((offsets[0], offsets[1], name))
    end = 0
    for begin, stop, name in sorted(spans):
        if begin != end:
            raise bad(f"header tensor {_shown(name)}: data_offsets start at {begin:,}, not at {end:,} where the "
                      "previous tensor ends (overlapping or with a gap)")
        end = stop
    if end != data:
        raise bad(f"header: its tensors cover {end:,} of the {data:,} data bytes")


def _index(folder: Path, where: str) -> None:
    """The shard index names only ``.safetensors`` files of the folder itself."""
    path = folder / INDEX
    doc = _json(path, where)
    shards = doc.get("weight_map") if isinstance(doc, dict) else None
    if not (isinstance(shards, dict) and all(isinstance(v, str) for v in shards.values())):
        raise FolderError(f"{where}: {shown(path)}: weight_map is not an object of shard file names")
    for shard in sorted(set(shards.values())):
        inside = not PurePosixPath(shard).is_absolute() and ".." not in PurePosixPath(shard).parts
        if not (inside and shard.endswith(WEIGHTS) and (folder / shard).is_file()):
            raise FolderError(f"{where}: {shown(path)}: weight_map names {_shown(shard)}, not a {WEIGHTS} file of "
                              "the folder")
