"""Stage export_instruct: the instruct model (models/instruct) as a Hugging Face checkpoint
(models/hf-instruct) through the export stage's code, with the chat template in
``tokenizer_config.json`` and the model card (README.md, ``base_model`` in its metadata)."""

from __future__ import annotations

from pathlib import Path

from marin import stages
from marin.config import Params
from marin.export import instruct_card
from marin.export.export_stage import Target, export
from marin.ledger import Input

_DECLARED = stages.declaration("export_instruct")  # the paths: marin/stages/table.py
INSTRUCT = Target(_DECLARED.name, _DECLARED.input("model"), _DECLARED.out("hf_model"), chat=True,
                  inputs=(Input("instructions_manifest", instruct_card.MANIFEST.as_posix()),
                          Input("instruct_eval", instruct_card.EVAL.as_posix()),
                          Input("instruct_eval_context", instruct_card.EVAL_CONTEXT.as_posix())),
                  card=instruct_card.card, recorded=instruct_card.recorded)


def run_stage(root: Path, params: Params) -> None:
    """The export_instruct stage: models/instruct into models/hf-instruct, recorded as a ledger run."""
    export(root, params, INSTRUCT)
