"""Stage export: the trained model as a Hugging Face checkpoint (models/hf/) that
``transformers`` loads with ``AutoModelForCausalLM`` and ``AutoTokenizer``: ``models/final``
mapped by :mod:`marin.export.hf`, the tokenizer beside it and the model card as README.md
(:mod:`marin.export.card`), recorded as a ledger run. The folder is what the Hub's
``upload_folder`` sends, nothing more.

The same code exports the instruct model (stage export_instruct, ``export_instruct_stage.INSTRUCT``):
models/instruct into models/hf-instruct, with the chat template in ``tokenizer_config.json``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marin import fsutil, hashing, model_folder, readers, stages
from marin.config import Params
from marin.data import chat
from marin.data.tokenize import EOS
from marin.errors import IntegrityError, StageError
from marin.evaluate import metrics_file
from marin.export import card, hf, training
from marin.export.training import Training
from marin.ledger import Input, Recipe, Run

_DECLARED = stages.declaration("export")  # the paths below: marin/stages/table.py
MODEL, TOKENIZER, OUT = _DECLARED.input("model"), _DECLARED.input("tokenizer"), _DECLARED.out("hf_model")
TEMPLATE = Path(stages.declaration("tokenize").out("tokens")) / chat.TEMPLATE_FILE
EVAL, EVAL_CONTEXT = _DECLARED.input("eval"), _DECLARED.input("eval_context")
CARD_PARAMS = ("report", "fetch", "evaluate")  # what the base card states: recorded as the run's params


@dataclass(frozen=True)
class Target:
    """One export: its stage, the marin model it reads, the folder it writes, whether the chat template
    goes into the tokenizer config, the inputs its card reads besides the model and the tokenizer, the
    card (README.md) from those, and the params the card reads (recorded as the run's params)."""

    stage: str
    model: Path
    out: Path
    card: Callable[[Path, dict[str, Any], dict[str, Any], bytes, Training], str]  # (root, recorded params, config,
    #                                                                          tokenizer, the run that trained it)
    recorded: Callable[[Params], dict[str, Any]]
    chat: bool = False
    inputs: tuple[Input, ...] = ()




def card_sample(params: dict, config: dict, tokenizer_json: bytes) -> card.Sample:
    """The card's example: the first evaluate prompt, and as many of the recorded greedy tokens as fit
    the context after the end-of-text token and the prompt."""
    from tokenizers import Tokenizer

    prompt = params["evaluate"]["prompts"][0]
    ids = chat.text_ids(Tokenizer.from_str(tokenizer_json.decode()), prompt)
    room = config["model"]["max_seq_len"] - 1 - len(ids)
    return card.Sample(prompt, max(1, min(params["evaluate"]["sample_tokens"], room)))


def model_card(params: dict, config: dict, tokenizer_json: bytes, eval_json: dict, folder: Path,
               train: Training | None = None, **kw) -> str:
    """README.md of the export at ``folder`` from the run's recorded params and inputs."""
    meta = params.get("report") or {"model_name": "marin-model", "license": "unknown"}
    return card.hub_card(meta, params["fetch"]["sources"], config, eval_json,
                         card_sample(params, config, tokenizer_json), folder.as_posix(), training=train, **kw)


def base_card(root: Path, recorded: dict[str, Any], config: dict[str, Any], tok: bytes, train: Training) -> str:
    """models/hf/README.md: the card from the recorded params, metrics/eval.json (with its context file) and
    the train run behind models/final (:mod:`marin.export.training`)."""
    return model_card(recorded, config, tok, metrics_file.read(root, EVAL, EVAL_CONTEXT, StageError), OUT, train)


BASE = Target("export", MODEL, OUT, card=base_card,
              inputs=(Input("eval", EVAL.as_posix()), Input("eval_context", EVAL_CONTEXT.as_posix())),
              recorded=lambda params: params.section(*(n for n in CARD_PARAMS if n in params.raw)))


def run_stage(root: Path, params: Params) -> None:
    """The export stage: models/final into models/hf, recorded as a ledger run."""
    export(root, params, BASE)


def export(root: Path, params: Params, target: Target) -> None:
    """``target.model`` into ``target.out``, recorded as a ledger run of ``target.stage``."""
    inputs = [Input("model", target.model.as_posix()), Input("tokenizer", TOKENIZER.as_posix())]
    inputs += [Input("chat_template", TEMPLATE.as_posix())] if target.chat else []
    trained_by = training.training_run(root, target.model)  # its ledger file: what the card says of training
    inputs += [Input("training_run", trained_by.as_posix())]
    recorded = target.recorded(params)
    with Run.start(root, Recipe(target.stage, recorded, [*inputs, *target.inputs],
                                     closure=stages.code_files(root, target.stage))) as run:
        tensors, config = model_folder.read(root / target.model)
        tok = readers.read_bytes(root / TOKENIZER, "tokenizer", StageError)
        if hashing.bytes_digest(tok) != config["tokenizer"]["digest"]:
            raise IntegrityError(f"{TOKENIZER}: is not the tokenizer the model was trained with "
                                 f"({config['tokenizer']['digest']}); rerun `dvc repro` from tokenize")
        template = readers.read_text(root / TEMPLATE, "text", StageError) if target.chat else None
        readme = target.card(root, recorded, config, tok,
                             training.training(root, trained_by, config["model"]["max_seq_len"]))
        files = hf.files(tensors, config, tok, EOS, {"marin_tensor_digest": config["tensor_digest"]}, readme,
                         template)
        with fsutil.atomic_dir(root / target.out) as tmp:
            for name, data in files.items():
                fsutil.write_bytes(tmp / name, data)
            run.output("hf_model", target.out, source=tmp, tensor_digest=config["tensor_digest"],
                       meta={"format": "transformers LlamaForCausalLM", "model_folder_digest": next(
                           i["digest"] for i in run.started.body_as("run.started")["inputs"] if i["name"] == "model")})
        print(f"{target.stage}: wrote {target.out}/ (Hugging Face Llama and its model card; "
              f"tensor digest {config['tensor_digest']})")
