"""Issue 55, defects 4 and 6: the reference inputs a stranger supplies, refused in one line.

``marin reference check`` reads ``published-digests.json``, the file a stranger's clone supplies: not
JSON, the wrong shape, nested too deeply, a fifo or a link to /dev/zero were tracebacks or "missing".
A reference model folder (``evaluate.references``) was the one input that could point outside the
project (a link hashed and loaded as a copy would be; a fifo left out of its digest), and each hostile
folder (a pickle, remote code, a fifo for weights, a header claiming 2^62 bytes) was refused by torch or
transformers as a traceback after 30-60 s and ~1 GB. Each case runs as a measured child process
(tests/test_bounded.py's helpers): one line, the exit code, under 10 CPU s and 500 MB, no code of the
folder run, and where a project is involved the ledger valid with every earlier run file unchanged.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

from marin import hashing
from tests.conftest import REPO, Project, mini_params, new_project
from tests.test_bounded import ledger_kept, refused, run

# -- 6a. published-digests.json ------------------------------------------------------------------

PUBLISHED = json.loads((REPO / "published-digests.json").read_text())


def _with(**changed: object) -> bytes:
    return json.dumps({**PUBLISHED, **changed}).encode()


def _write(data: bytes) -> Callable[[Path], object]:
    return lambda path: path.write_bytes(data)


def _deep(depth: int) -> object:
    return json.loads("[" * depth + "]" * depth)


PUBLISHED_CASES: dict[str, tuple[Callable[[Path], object], str]] = {  # how the file is made, what the line says
    "not json": (_write(b"not json"), "published-digests.json: not JSON (Expecting value"),
    "an empty object": (_write(b"{}"), "published-digests.json: about: missing; it is required"),
    "a list": (_write(b"[1]"), "published-digests.json: <root>: [1] has the wrong type; expected object"),
    "not UTF-8": (_write(b'{"about": "\xff"}'), "published-digests.json: not JSON ("),
    "nested past the parser": (_write(b"[" * 100_000 + b"]" * 100_000), "not JSON this reader takes (nested too"),
    "nested in a field": (_write(_with(why=_deep(800))), "published-digests.json: why: [[[[[[[[[[[[[[[[[[[[[[[[["),
    "a digest that is a number": (_write(_with(params_digest=5)), "params_digest: 5 has the wrong type"),
    "models a list": (_write(_with(models=["sha256:" + "0" * 64])), "models: [\"sha256:000"),
    "a model digest of md5": (_write(_with(models={"models/final": "md5:" + "0" * 32})),
                              "models.models/final: \"md5:0000"),
    "a metric a list": (_write(_with(metrics={"bits_per_byte": [1.5]})), "metrics.bits_per_byte: [1.5]"),
    "an unknown key": (_write(_with(extra=1)), "extra: unknown key"),
    "over its cap": (_write(b" " * (1 << 20) + b"{}"), "over the 1,048,576-byte cap for published digests"),
    "a fifo": (lambda p: os.mkfifo(p), "published-digests.json: is a fifo, not published digests"),
    "a link to /dev/zero": (lambda p: p.symlink_to("/dev/zero"), "published-digests.json: is a symbolic link"),
    "a folder": (lambda p: p.mkdir(), "published-digests.json: is a directory"),
}


def _checked_out(tmp_path: Path) -> Project:
    """A clone's shipped params.yaml with an empty ledger: what `marin reference check` reads first."""
    root = tmp_path / "clone"
    (root / "ledger" / "runs").mkdir(parents=True)
    shutil.copy2(REPO / "params.yaml", root / "params.yaml")
    return Project(root)


@pytest.mark.parametrize("case", sorted(PUBLISHED_CASES))
def test_malformed_published_digests_are_refused_in_one_line(tmp_path: Path, case: str) -> None:
    make, said = PUBLISHED_CASES[case]
    clone = _checked_out(tmp_path)
    make(clone.root / "published-digests.json")
    refused(run(clone, "-m", "marin.cli", "reference", "check"), 2, said)
    ledger_kept(clone, {})


def _models(root: Path, weights: bytes) -> None:
    for m in ("models/final", "models/instruct"):
        (root / m).mkdir(parents=True)
        (root / m / "config.json").write_text(json.dumps({"weights": "model.safetensors",
                                                          "tensor_digest": "sha256:" + "0" * 64}))
        (root / m / "model.safetensors").write_bytes(weights)


@pytest.mark.parametrize("case, weights, said", [
    ("a header of 2^62 bytes", (1 << 62).to_bytes(8, "little") + b"{}", "models/final/model.safetensors: not a "
     "readable safetensors file"),
    ("cut short", b"\x02", "models/final/model.safetensors: not a readable safetensors file"),
])
def test_a_model_that_does_not_load_is_one_line_naming_its_file(tmp_path: Path, case: str, weights: bytes,
                                                                said: str) -> None:
    """Past the published file's shape: the shipped params, our models' weights read by safetensors."""
    clone = _checked_out(tmp_path)
    shutil.copy2(REPO / "published-digests.json", clone.root / "published-digests.json")
    _models(clone.root, weights)
    refused(run(clone, "-m", "marin.cli", "reference", "check"), 1, said)


# -- 4 and 6b. a hostile reference folder, refused before it is hashed or loaded -------------------

MARKER = "code-ran"  # written by the folder's own code, were it ever run


class _Payload:
    """A pickle that writes MARKER when it is loaded."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (Path.write_text, (Path(self.path), "pickle ran"))


def _safetensors(folder: Path) -> None:
    save_file({"w": np.arange(4, dtype=np.float32)}, str(folder / "model.safetensors"))


def _header(folder: Path, header: dict, data: int) -> None:
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0" * data)


def _link_out(folder: Path) -> None:
    outside = folder.parent.parent / "outside"
    outside.mkdir(exist_ok=True)
    _safetensors(outside)
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(outside / "model.safetensors")


def _replace(folder: Path, make: Callable[[Path], object]) -> None:
    (folder / "model.safetensors").unlink()
    make(folder / "model.safetensors")


def _socket(folder: Path) -> None:
    with contextlib.chdir(folder), socket.socket(socket.AF_UNIX) as s:  # a relative name: sun_path is short
        s.bind("agent.sock")


def _pickle(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"w": _Payload(folder.parent.parent / MARKER)}))


def _auto_map(name: str) -> Callable[[Path], None]:
    def make(folder: Path) -> None:
        doc = json.loads((folder / name).read_text()) if (folder / name).is_file() else {}
        doc["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.Evil", "AutoTokenizer": ["tok_evil.Evil", None]}
        (folder / name).write_text(json.dumps(doc))
        (folder / "modeling_evil.py").write_text(f"open({str(folder.parent.parent / MARKER)!r}, 'w').write('ran')\n")
    return make


def _index(folder: Path) -> None:
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"w": "../../outside/model.safetensors"}}))


F32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
FOLDER_CASES: dict[str, tuple[Callable[[Path], object], str]] = {  # how the folder is spoilt, what the line says
    "weights linked outside": (_link_out, "model.safetensors is a symbolic link; a reference folder holds its own"),
    "weights linked to /dev/zero": (lambda f: _replace(f, lambda p: p.symlink_to("/dev/zero")),
                                    "model.safetensors is a symbolic link"),
    "a linked subfolder": (lambda f: (f / "more").symlink_to(f.parent.parent / "outside", target_is_directory=True),
                           "/more is a symbolic link"),
    "a fifo for weights": (lambda f: _replace(f, os.mkfifo), "model.safetensors is a fifo"),
    "a fifo beside the weights": (lambda f: os.mkfifo(f / "notes.txt"), "notes.txt is a fifo"),
    "a socket": (_socket, "agent.sock is a socket"),
    "pickled weights": (_pickle, "pytorch_model.bin is weights in a format other than safetensors"),
    "auto_map in config.json": (_auto_map("config.json"), "config.json: auto_map asks for the model's own code"),
    "auto_map in tokenizer_config.json": (_auto_map("tokenizer_config.json"),
                                          "tokenizer_config.json: auto_map asks for the model's own code"),
    "a header of 2^62 bytes": (lambda f: (f / "model.safetensors").write_bytes((1 << 62).to_bytes(8, "little") + b"{}"),
                               "model.safetensors: header length 4,611,686,018,427,387,904 bytes, over the "
                               "16,777,216-byte cap"),
    "a header past the end": (lambda f: (f / "model.safetensors").write_bytes((100).to_bytes(8, "little") + b"{}"),
                              "model.safetensors: header length 100 bytes, past the end of the file (10 bytes)"),
    "a file shorter than a header": (lambda f: (f / "model.safetensors").write_bytes(b"\x02"),
                                     "model.safetensors: only 1 of the 8 bytes that give its header's length"),
    "a header that is not JSON": (lambda f: (f / "model.safetensors").write_bytes((5).to_bytes(8, "little") + b"{nope"),
                                  "model.safetensors: header is not a JSON object"),
    "a header of unknown dtype": (lambda f: _header(f, {"w": {**F32, "dtype": "F128"}}, 8),
                                  "header tensor \"w\": dtype \"F128\" is not a safetensors dtype"),
    "a header whose shape lies": (lambda f: _header(f, {"w": {**F32, "shape": [1 << 40]}}, 8),
                                  "data_offsets [0, 8] do not hold shape [1099511627776] of F32"),
    "overlapping tensors": (lambda f: _header(f, {"a": F32, "b": {**F32, "data_offsets": [4, 12]}}, 12),
                            "header tensor \"b\": data_offsets start at 4, not at 8"),
    "offsets past the data": (lambda f: _header(f, {"w": {**F32, "data_offsets": [0, 1 << 50]}}, 8),
                              "data_offsets [0, 1125899906842624] do not lie in its 8 data bytes"),
    "a shard index leading out": (_index, "weight_map names \"../../outside/model.safetensors\""),
    "no model_type": (lambda f: (f / "config.json").write_text("{}"), "config.json: model_type is null"),
    "config.json nested too deeply": (lambda f: (f / "config.json").write_text("[" * 100_000),
                                      "evaluate.references config-json-nested-too-deeply: refs/config-json-nested-"
                                      "too-deeply/config.json: not JSON this reader takes (nested too deeply); "
                                      "download the model's files again"),
    "no weights": (lambda f: (f / "model.safetensors").unlink(), "holds no .safetensors file"),
    "a card whose YAML does not parse": (lambda f: (f / "README.md").write_text("---\nparameters: [1\n---\n"),
                                         "README.md: its YAML metadata does not parse"),
}


@pytest.fixture(scope="module")
def referenced(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Project:
    """A project whose fetch ran (an earlier run in its ledger); each test lists its own reference."""
    proj = new_project(tmp_path_factory.mktemp("ref") / "proj", mini_params(corpus))
    proj.stage("fetch")
    return proj


def _reference(proj: Project, case: str, make: Callable[[Path], object] | None) -> tuple[str, Path]:
    """A folder refs/<name> of a plain safetensors model spoilt by ``make``, listed in params.yaml and
    pinned by its digest where it has one (so that only the spoiling can refuse it)."""
    name = "".join(c if c.isalnum() else "-" for c in case.lower())[:60]
    folder = proj.root / "refs" / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    _safetensors(folder)
    if make is not None:
        make(folder)
    try:
        pin = hashing.dir_digest(folder, links=False).removeprefix(hashing.PREFIX)
    except hashing.NotPlain:
        pin = "0" * 64
    params = yaml.safe_load((proj.root / "params.yaml").read_text())
    params["evaluate"]["references"] = [{"name": name, "path": f"refs/{name}", "sha256": pin, "license": "MIT"}]
    proj.write_params(params)
    return name, folder


@pytest.mark.slow  # builds a project
@pytest.mark.parametrize("case", sorted(FOLDER_CASES))
def test_a_hostile_reference_folder_is_refused_before_it_is_hashed_or_loaded(referenced: Project,
                                                                            case: str) -> None:
    make, said = FOLDER_CASES[case]
    before = referenced.ledger_files()
    name, _ = _reference(referenced, case, make)
    line = refused(run(referenced, "-m", "pipeline.reference", name), 1, f"refs/{name}", said)
    assert "Traceback" not in line and not (referenced.root / MARKER).exists()  # no code of the folder ran
    assert referenced.ledger_files() == before  # refused before any run started
    ledger_kept(referenced, before)


@pytest.mark.slow  # builds a project
def test_a_plain_reference_folder_passes_the_checks_and_meets_its_pin(referenced: Project) -> None:
    """The same folder unspoilt passes every check: what refuses it is its pin, in one line, in a second
    (before torch is imported), with the digest it has."""
    before = referenced.ledger_files()
    name, folder = _reference(referenced, "plain", None)
    params = yaml.safe_load((referenced.root / "params.yaml").read_text())
    params["evaluate"]["references"][0]["sha256"] = "0" * 64
    referenced.write_params(params)
    digest = hashing.dir_digest(folder, links=False).removeprefix(hashing.PREFIX)
    refused(run(referenced, "-m", "pipeline.reference", name), 1, f"refs/{name} has sha256 {digest}, params.yaml "
            f"pins {'0' * 64}")
    ledger_kept(referenced, before)
