"""The pipeline's stages: each declared once (:mod:`marin.stages.table`), run by one runtime
(:mod:`marin.stages.runner`), its code found by :mod:`marin.stages.closure`, ``dvc.yaml`` generated
from the declarations (:mod:`marin.stages.dvcyaml`) and read back (:mod:`marin.stages.dvcfiles`)."""

from marin.stages.declaration import Out, Stage, current
from marin.stages.table import (
    CLI_MODULE,
    DVC_YAML,
    INSTRUCT,
    MODEL,
    NAMES,
    REFERENCE,
    SOURCE_STAGES,
    STAGES,
    TRAINING,
    code_files,
    declaration,
    declared,
    entry_modules,
    get,
    reference,
)

__all__ = ["CLI_MODULE", "DVC_YAML", "INSTRUCT", "MODEL", "NAMES", "REFERENCE", "SOURCE_STAGES", "STAGES",
           "TRAINING", "Out", "Stage", "code_files", "current", "declaration", "declared", "entry_modules", "get",
           "reference"]
