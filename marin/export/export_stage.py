"""Stage export: the trained model as a Hugging Face checkpoint (models/hf/) that
``transformers`` loads with ``AutoModelForCausalLM`` and ``AutoTokenizer``: ``models/final``
mapped by :mod:`marin.export.hf`, the tokenizer beside it, recorded as a ledger run.

The same code exports the instruct model (stage export_instruct, :data:`INSTRUCT`): models/instruct
into models/hf-instruct, with the chat template in ``tokenizer_config.json``."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.numpy import load_file

from marin import fsutil, hashing
from marin.config import Params
from marin.data import chat
from marin.data.tokenize import EOS
from marin.errors import IntegrityError
from marin.export import hf
from marin.ledger import Input, Run

MODEL, TOKENIZER, OUT = Path("models/final"), Path("data/tokens/tokenizer.json"), Path("models/hf")
TEMPLATE = Path("data/tokens") / chat.TEMPLATE_FILE


@dataclass(frozen=True)
class Target:
    """One export: its stage, the marin model it reads, the folder it writes, whether the chat
    template goes into the tokenizer config, and extra files (a model card) from the run's inputs."""

    stage: str
    model: Path
    out: Path
    chat: bool = False
    inputs: tuple[Input, ...] = ()  # read by ``extra`` besides the model and the tokenizer
    extra: Callable[[Path, Params, dict[str, Any]], dict[str, bytes]] | None = None
    recorded: Callable[[Params], dict[str, Any]] = lambda params: {}  # the params ``extra`` reads


BASE = Target("export", MODEL, OUT)


def read_model(directory: Path) -> tuple[hf.Tensors, dict]:
    """marin's tensors by dotted name and its config.json; the tensor digest is checked."""
    config = json.loads((directory / "config.json").read_text())
    tensors = load_file(str(directory / config["weights"]))
    digest = hashing.tree_digest(tensors)
    if digest != config["tensor_digest"]:
        raise IntegrityError(f"{directory / config['weights']}: tensors hash to {digest}, config.json records "
                             f"{config['tensor_digest']}; rerun the train stage (dvc repro train)")
    return tensors, config


def run_stage(root: Path, params: Params) -> None:
    """The export stage: models/final into models/hf, recorded as a ledger run."""
    export(root, params, BASE)


def export(root: Path, params: Params, target: Target) -> None:
    """``target.model`` into ``target.out``, recorded as a ledger run of ``target.stage``."""
    inputs = [Input("model", target.model.as_posix()), Input("tokenizer", TOKENIZER.as_posix())]
    inputs += [Input("chat_template", TEMPLATE.as_posix())] if target.chat else []
    with Run.start(root, target.stage, params=target.recorded(params), inputs=[*inputs, *target.inputs]) as run:
        tensors, config = read_model(root / target.model)
        tok = (root / TOKENIZER).read_bytes()
        if hashing.bytes_digest(tok) != config["tokenizer"]["digest"]:
            raise IntegrityError(f"{TOKENIZER}: is not the tokenizer the model was trained with "
                                 f"({config['tokenizer']['digest']}); rerun `dvc repro` from tokenize")
        template = (root / TEMPLATE).read_text(encoding="utf-8") if target.chat else None
        out = hf.files(tensors, config, tok, EOS, {"marin_tensor_digest": config["tensor_digest"]}, template)
        out.update(target.extra(root, params, config) if target.extra else {})
        with fsutil.atomic_dir(root / target.out) as tmp:
            for name, data in out.items():
                fsutil.write_bytes(tmp / name, data)
            run.output("hf_model", target.out, source=tmp, tensor_digest=config["tensor_digest"],
                       meta={"format": "transformers LlamaForCausalLM", "model_folder_digest": next(
                           i["digest"] for i in run.started.body["inputs"] if i["name"] == "model")})
        print(f"{target.stage}: wrote {target.out}/ (Hugging Face Llama; tensor digest {config['tensor_digest']})")
