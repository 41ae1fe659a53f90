"""Stage export: the trained model as a Hugging Face checkpoint (models/hf/) that
``transformers`` loads with ``AutoModelForCausalLM`` and ``AutoTokenizer``: ``models/final``
mapped by :mod:`marin.export.hf`, the tokenizer beside it, recorded as a ledger run."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.numpy import load_file

from marin import fsutil, hashing
from marin.config import Params
from marin.data.tokenize import EOS
from marin.errors import IntegrityError
from marin.export import hf
from marin.ledger import Input, Run

MODEL, TOKENIZER, OUT = Path("models/final"), Path("data/tokens/tokenizer.json"), Path("models/hf")


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
    inputs = [Input("model", MODEL.as_posix()), Input("tokenizer", TOKENIZER.as_posix())]
    with Run.start(root, "export", params={}, inputs=inputs) as run:
        tensors, config = read_model(root / MODEL)
        tok = (root / TOKENIZER).read_bytes()
        if hashing.bytes_digest(tok) != config["tokenizer"]["digest"]:
            raise IntegrityError(f"{TOKENIZER}: is not the tokenizer the model was trained with "
                                 f"({config['tokenizer']['digest']}); rerun `dvc repro` from tokenize")
        out = hf.files(tensors, config, tok, EOS, {"marin_tensor_digest": config["tensor_digest"]})
        with fsutil.atomic_dir(root / OUT) as tmp:
            for name, data in out.items():
                fsutil.write_bytes(tmp / name, data)
            run.output("hf_model", OUT, source=tmp, tensor_digest=config["tensor_digest"],
                       meta={"format": "transformers LlamaForCausalLM", "model_folder_digest": next(
                           i["digest"] for i in run.started.body["inputs"] if i["name"] == "model")})
        print(f"export: wrote {OUT}/ (Hugging Face Llama; tensor digest {config['tensor_digest']})")
