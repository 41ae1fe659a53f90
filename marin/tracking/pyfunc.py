"""The trained model as an MLflow ``pyfunc`` model: ``mlflow.pyfunc.load_model("models:/<id>")``
gives a model whose ``predict(["ROMEO."])`` continues each prompt greedily with the JAX model,
exactly as the evaluate stage samples (the prompt after an end-of-text token, a window of the
model's context sliding over longer outputs). The folder holds ``MLmodel``, the model's own files
(``artifacts/model/``: weights and config.json) and its tokenizer (``artifacts/tokenizer.json``).
Loading it needs the marin package (this environment).

The generator itself is ``generator_model.py``, the file MLflow keeps with the model and runs to
load it ("models from code"). No stage imports it: it is part of every stage's code as a file read by
path (marin/closure.py), and the model code it imports when a user loads the model (marin.train,
marin.evaluate) stays out of the code of the stages that only mirror themselves into MLflow."""

from __future__ import annotations

import warnings
from pathlib import Path

import mlflow.pyfunc

from marin import readers

MAX_NEW_TOKENS = 40  # the evaluate stage's default sample length (evaluate.sample_tokens)
GENERATOR = Path(__file__).with_name("generator_model.py")


def save(dest: Path, model_dir: Path, tokenizer: Path) -> None:
    """The pyfunc model of ``model_dir`` (models/final) and its tokenizer, written to ``dest``."""
    from importlib.metadata import version

    config = readers.read_json(model_dir / "config.json", "config")
    with warnings.catch_warnings():  # "no input example": one would run the model at every sync
        warnings.simplefilter("ignore", UserWarning)
        mlflow.pyfunc.save_model(
            str(dest), python_model=str(GENERATOR),
            model_config={"max_new_tokens": MAX_NEW_TOKENS},
            artifacts={"model": str(model_dir), "tokenizer": str(tokenizer)},
            pip_requirements=[f"marin=={version('marin')}"],  # what loads it: marin's locked environment
            metadata={"marin_tensor_digest": config["tensor_digest"]})
