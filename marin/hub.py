"""The Hugging Face Hub kept out of reach. marin never downloads from the Hub while it runs: the
harness reads local task data and local models, and the transformers flavor is written from a local
export. Libraries still try: MLflow's transformers ``save_model`` asks the Hub for a licence file of
the repository a pipeline names, which for a local export is its folder ("models/hf", somebody else's
name), and with no network its five retries slept 23 of the 28 s a save took (measured, export stage,
MLflow on). Offline, such a request fails at once."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """``HF_HUB_OFFLINE`` for the block: in the environment (libraries that read it later) and in
    ``huggingface_hub``'s constant, which it reads only when first imported; both are put back."""
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
