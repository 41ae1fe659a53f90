"""The code MLflow keeps with the pyfunc model and runs to load it ("models from code", not a
pickle): greedy text continuation by marin's JAX model, as the evaluate stage samples. Loaded by
MLflow from this file's path (marin.tracking.pyfunc.save), never imported by a stage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow.pyfunc
from mlflow.models import set_model

from marin.tracking.pyfunc import MAX_NEW_TOKENS


class Generator(mlflow.pyfunc.PythonModel):  # pyright: ignore[reportPrivateImportUsage]
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


set_model(Generator())
