"""The trained model as an MLflow ``pyfunc`` model: ``mlflow.pyfunc.load_model("models:/<id>")``
gives a model whose ``predict(["ROMEO."])`` continues each prompt greedily with the JAX model,
exactly as the evaluate stage samples (the prompt after an end-of-text token, a window of the
model's context sliding over longer outputs). The folder holds ``MLmodel``, the model's own files
(``artifacts/model/``: weights and config.json) and its tokenizer (``artifacts/tokenizer.json``).
Loading it needs the marin package (this environment)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import mlflow.pyfunc

MAX_NEW_TOKENS = 40  # the evaluate stage's default sample length (evaluate.sample_tokens)


class Generator(mlflow.pyfunc.PythonModel):
    """Greedy text continuation by marin's JAX model."""

    def load_context(self, context: Any) -> None:
        import jax
        from flax import nnx

        from marin.data import tokenize as tk
        from marin.train import weights

        graphdef, self.params, config = weights.load(Path(context.artifacts["model"]))
        self.tokenizer = tk.load(Path(context.artifacts["tokenizer"]))
        self.eos, self.seq_len = config["tokenizer"]["eos_id"], config["model"]["max_seq_len"]
        self.logits = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))

    def predict(self, context: Any, model_input: list[str], params: dict[str, Any] | None = None) -> list[str]:
        """One completion per prompt, ``max_new_tokens`` long (the model config's: ``load_model(uri,
        model_config={"max_new_tokens": n})`` changes it)."""
        from marin.evaluate.scoring import greedy

        n = int((context.model_config or {}).get("max_new_tokens", MAX_NEW_TOKENS))
        out = []
        for prompt in model_input:
            ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids
            out.append(self.tokenizer.decode(greedy(self.logits, self.params, ids, self.eos, self.seq_len, n)))
        return out


def save(dest: Path, model_dir: Path, tokenizer: Path) -> None:
    """The pyfunc model of ``model_dir`` (models/final) and its tokenizer, written to ``dest``."""
    from importlib.metadata import version

    config = json.loads((model_dir / "config.json").read_text())
    with warnings.catch_warnings():  # "no input example": one would run the model at every sync
        warnings.simplefilter("ignore", UserWarning)
        mlflow.pyfunc.save_model(
            str(dest), python_model=str(Path(__file__).with_name("generator_model.py")),
            model_config={"max_new_tokens": MAX_NEW_TOKENS},
            artifacts={"model": str(model_dir), "tokenizer": str(tokenizer)},
            pip_requirements=[f"marin=={version('marin')}"],  # what loads it: marin's locked environment
            metadata={"marin_tensor_digest": config["tensor_digest"]})
