"""The code MLflow keeps with the pyfunc model and runs to load it ("models from code", not a
pickle): text continuation by marin's JAX model, greedy as the evaluate stage samples unless a
temperature is given. Loaded by
MLflow from this file's path (marin.tracking.pyfunc.save), never imported by a stage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd
from mlflow.models import set_model

from marin.tracking.pyfunc import PARAMS


class Generator(mlflow.pyfunc.PythonModel):  # pyright: ignore[reportPrivateImportUsage]
    """Text continuation by marin's JAX model (greedy at temperature 0)."""

    def load_context(self, context: Any) -> None:
        import jax
        from flax import nnx

        from marin.data import tokenize as tk
        from marin.model import weights

        graphdef, self.params, config = weights.load(Path(context.artifacts["model"]))
        self.tokenizer = tk.load(Path(context.artifacts["tokenizer"]))
        self.eos, self.seq_len = config["tokenizer"]["eos_id"], config["model"]["max_seq_len"]
        self.logits = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> list[str]:
        """One completion per prompt (the signature's one string column), ``max_new_tokens`` long; the
        params MLflow passes are the call's, completed with the signature's defaults."""
        from marin.model.decode import greedy

        p = {**{n: d for n, _, d in PARAMS}, **(params or {})}
        n, temperature = int(p["max_new_tokens"]), float(p["temperature"])
        rng = np.random.default_rng(int(p["seed"]))
        out = []
        for prompt in model_input.iloc[:, 0]:
            ids = self.tokenizer.encode(str(prompt), add_special_tokens=False).ids
            got = greedy(self.logits, self.params, ids, self.eos, self.seq_len, n) if temperature == 0 \
                else self._sampled(ids, n, temperature, rng)
            out.append(self.tokenizer.decode(got))
        return out

    def _sampled(self, ids: list[int], n: int, temperature: float, rng: np.random.Generator) -> list[int]:
        """``n`` tokens drawn from softmax(logits / temperature), on the greedy path's window and buffer."""
        ids, out = [self.eos, *ids][-self.seq_len:], []
        for _ in range(n):
            window = (ids + out)[-self.seq_len:]
            buf = np.full((1, self.seq_len), self.eos, dtype=np.int32)
            buf[0, : len(window)] = window
            z = np.asarray(self.logits(self.params, buf), dtype=np.float64)[0, len(window) - 1] / temperature
            prob = np.exp(z - z.max())
            out.append(int(rng.choice(len(prob), p=prob / prob.sum())))
        return out


set_model(Generator())
