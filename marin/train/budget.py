"""Training-budget facts: how many times a run reads its training tokens (epochs) and how many
tokens it sees per parameter. Past a few epochs a small model memorises its training text
(BYOD corpora of a few hundred KB reach ~90 epochs at the default 400 steps), so the train
stage says so in one line (``train.max_epochs_warning``)."""

from __future__ import annotations

from dataclasses import dataclass

# The reference a reader needs beside tokens per parameter: Hoffmann et al. 2022 ("Chinchilla") found about 20
# training tokens per parameter compute-optimal
CHINCHILLA = "Chinchilla compute-optimal: ~20, Hoffmann et al. 2022"


@dataclass(frozen=True)
class Budget:
    tokens_seen: int  # steps x batch size x sequence length
    unique_tokens: int  # tokens of the training split (the tokenize manifest)
    n_params: int

    @property
    def epochs(self) -> float:
        """Tokens seen over unique training tokens."""
        return self.tokens_seen / self.unique_tokens if self.unique_tokens else float("inf")

    @property
    def tokens_per_param(self) -> float:
        return self.tokens_seen / self.n_params

    def line(self) -> str:
        return (f"train: {self.tokens_seen:,} tokens seen = {self.epochs:.3g} epochs of {self.unique_tokens:,} unique "
                f"training tokens, {self.tokens_per_param:.3g} tokens per parameter ({CHINCHILLA})")

    def warning(self, max_epochs: float) -> str | None:
        """One line when the run goes past ``max_epochs`` epochs, else None."""
        if self.epochs <= max_epochs:
            return None
        return (f"marin: warning: train: {self.epochs:.3g} epochs ({self.tokens_seen:,} tokens seen, "
                f"{self.unique_tokens:,} unique) is past train.max_epochs_warning ({max_epochs:g}): the model will "
                "memorise its training text; lower train.steps or add data")
