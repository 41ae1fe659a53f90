"""The Flax NNX decoder-only transformer (``marin.model.transformer``)."""

from marin.model.transformer import ModelConfig, Transformer, count_params

__all__ = ["ModelConfig", "Transformer", "count_params"]
