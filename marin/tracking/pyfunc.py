"""The trained model as an MLflow ``pyfunc`` model: ``mlflow.pyfunc.load_model("models:/<id>")``
gives a model whose ``predict(["ROMEO."])`` continues each prompt greedily with the JAX model,
exactly as the evaluate stage samples (the prompt after an end-of-text token, a window of the
model's context sliding over longer outputs). Its signature's params (``PARAMS``) change that per
call: ``predict([...], params={"max_new_tokens": 5, "temperature": 0.8, "seed": 1})``; a temperature
above 0 samples from the softmax of the logits divided by it, with a NumPy generator seeded by ``seed``.
The folder holds ``MLmodel``, the model's own files
(``artifacts/model/``: weights and config.json) and its tokenizer (``artifacts/tokenizer.json``).
Loading it needs the marin package (this environment).

The generator itself is ``generator_model.py``, the file MLflow keeps with the model and runs to
load it ("models from code"). No stage imports it: it is part of every stage's code as a file read by
path (marin/stages/closure.py), and the model code it imports when a user loads the model (marin.train,
marin.evaluate) stays out of the code of the stages that only mirror themselves into MLflow."""

from __future__ import annotations

import warnings
from pathlib import Path

import mlflow.pyfunc

from marin import readers

MAX_NEW_TOKENS = 40  # the evaluate stage's default sample length (evaluate.sample_tokens)
# (name, MLflow type, default): the signature's params; the defaults are the evaluate stage's sampling
PARAMS = (("max_new_tokens", "long", MAX_NEW_TOKENS), ("temperature", "double", 0.0), ("seed", "long", 0))
GENERATOR = Path(__file__).with_name("generator_model.py")


def save(dest: Path, model_dir: Path, tokenizer: Path) -> None:
    """The pyfunc model of ``model_dir`` (models/final) and its tokenizer, written to ``dest``."""
    from importlib.metadata import version

    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

    config = readers.read_json(model_dir / "config.json", "config")
    signature = ModelSignature(inputs=Schema([ColSpec("string")]), outputs=Schema([ColSpec("string")]),
                               params=ParamSchema([ParamSpec(n, t, d) for n, t, d in PARAMS]))
    with warnings.catch_warnings():  # "no input example": one would run the model at every sync
        warnings.simplefilter("ignore", UserWarning)
        mlflow.pyfunc.save_model(
            str(dest), python_model=str(GENERATOR),
            signature=signature,
            artifacts={"model": str(model_dir), "tokenizer": str(tokenizer)},
            pip_requirements=[f"marin=={version('marin')}"],  # what loads it: marin's locked environment
            metadata={"marin_tensor_digest": config["tensor_digest"]})
