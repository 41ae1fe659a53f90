"""The Hugging Face export as an MLflow ``transformers`` model: ``mlflow.transformers.load_model(uri)``
gives a text-generation pipeline, ``mlflow.pyfunc.load_model(uri).predict([...], params=
{"max_new_tokens": n})`` its continuations. The folder (MLmodel, ``model/``, ``components/tokenizer/``,
the export's card as ``model_card.md``) is what MLflow's transformers flavor writes for a pipeline.

It needs transformers and torch (``uv sync --group hf``); without them the export is logged as its
files, as the Hub gets them, and a tag says why (:mod:`marin.tracking.models`)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

from marin import readers


def available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("transformers", "torch"))


@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """The Hugging Face Hub out of reach while the flavor is written. MLflow's ``save_model`` asks the Hub
    for a licence file of the repository the pipeline names, which for a local export is its folder
    ("models/hf"): a request about another repository, and with no network five retries that slept 23 of a
    stage's 28 s (measured, export stage, MLflow on). Offline, the request fails at once and MLflow writes
    its fallback licence text with the card's licence. ``huggingface_hub`` reads ``HF_HUB_OFFLINE`` when
    first imported, so its constant is set too, and both are put back."""
    from huggingface_hub import constants

    before_env, before_const = os.environ.get("HF_HUB_OFFLINE"), constants.HF_HUB_OFFLINE
    os.environ["HF_HUB_OFFLINE"], constants.HF_HUB_OFFLINE = "1", True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before_const
        if before_env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = before_env


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
    with warnings.catch_warnings(), hub_offline():  # "no input example": one would run the model at every sync
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
