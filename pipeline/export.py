"""Stage export: the trained model as a Hugging Face checkpoint (models/hf/) that
``transformers`` loads with ``AutoModelForCausalLM`` and ``AutoTokenizer``."""

from pathlib import Path

from marin.config import Params
from marin.stage import stage_main


def export_stage(root: Path, params: Params) -> None:
    from marin import export

    export.run(root)


if __name__ == "__main__":
    stage_main(export_stage)
