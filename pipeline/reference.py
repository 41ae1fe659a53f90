"""Stage reference_<name>: a Hugging Face model folder of evaluate.references scored beside ours, on
evaluate's requests (metrics/reference/<name>.json). The stage's code is
:mod:`marin.evaluate.reference_stage`; ``marin stages --write`` generates one stage per reference."""

import sys

from marin.stages import REFERENCE
from marin.stages.runner import stage_main

if __name__ == "__main__":
    name = next((a for a in sys.argv[1:] if not a.startswith("-")), "")
    stage_main(f"{REFERENCE}{name}")
