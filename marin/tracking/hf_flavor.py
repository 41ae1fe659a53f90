"""The Hugging Face export as an MLflow ``transformers`` model: ``mlflow.transformers.load_model(uri)``
gives a text-generation pipeline, ``mlflow.pyfunc.load_model(uri).predict([...], params=
{"max_new_tokens": n})`` its continuations. The folder (MLmodel, ``model/``, ``components/tokenizer/``,
the export's card as ``model_card.md``) is what MLflow's transformers flavor writes for a pipeline.

It needs transformers and torch (``uv sync --group hf``); without them the export is logged as its
files, as the Hub gets them, and a tag says why (:mod:`marin.tracking.models`)."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

from marin import readers
from marin.hub import hub_offline


def available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("transformers", "torch"))


def save(dest: Path, export: Path) -> None:
    """The export in ``export`` (models/hf) as a transformers-flavor model written to ``dest``."""
    import transformers
    from huggingface_hub import ModelCard
    from mlflow import transformers as flavor  # pyright: ignore[reportPrivateImportUsage]
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

    from marin.tracking.pyfunc import MAX_NEW_TOKENS

    card = ModelCard(readers.read_text(export / "README.md", "report")) if (export / "README.md").is_file() else None
    signature = ModelSignature(inputs=Schema([ColSpec("string")]), outputs=Schema([ColSpec("string")]),
                               params=ParamSchema([ParamSpec("max_new_tokens", "long", MAX_NEW_TOKENS)]))
    transformers.utils.logging.disable_progress_bar()  # "Loading weights": a stage's output is its own
    # offline: MLflow would ask the Hub for the licence of "models/hf" (marin.hub); "no input example"
    # warnings: one would run the model at every sync
    with warnings.catch_warnings(), hub_offline():
        warnings.simplefilter("ignore")
        pipe = transformers.pipeline("text-generation", model=str(export), tokenizer=str(export))
        # pinned by hand: MLflow's own inference also pins torchvision, which the hf group does not hold
        flavor.save_model(
            pipe, str(dest), task="text-generation", model_card=card, signature=signature,
            pip_requirements=[f"transformers=={transformers.__version__}", f"torch=={_version('torch')}"])
    # MLflow's fallback sends the reader to https://huggingface.co/<folder> ("models/hf"), a page that is not ours
    licence = card.data.to_dict().get("license") if card is not None else None
    (dest / "LICENSE.txt").write_text(f"License: {licence}, as the model card (model_card.md) declares it.\n"
                                      if licence else "No license is declared: the model card states none.\n")


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)
