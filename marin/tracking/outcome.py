"""What ``marin mlflow sync`` did, in one line, and where it wrote: the summary, the store's default
location and the error of a store that failed."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from marin.errors import MarinError

UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves by default


class TrackingError(MarinError):
    """MLflow could not be reached or refused a write."""


@dataclass
class SyncReport:
    uri: str
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    upgraded: list[str] = field(default_factory=list)  # export runs whose model gained the transformers flavor
    experiment: str | None = None

    @property
    def changes(self) -> int:
        return len(self.created) + len(self.updated) + len(self.upgraded)

    def summary(self) -> str:
        line = (f"mlflow sync to {self.uri}: {len(self.created)} run(s) created, {len(self.updated)} updated, "
                f"{len(self.unchanged)} unchanged")
        if self.upgraded:
            line += (f", {len(self.upgraded)} files-only export(s) logged with the transformers flavor "
                     f"({', '.join(self.upgraded)})")
        if self.experiment and self.uri.startswith("http"):  # MLflow 3.17's UI opens GenAI unless told
            line += f"; open {self.uri.rstrip('/')}/#/experiments/{self.experiment}?workflowType=machine_learning"
        elif self.experiment and self.uri.startswith("sqlite:"):
            line += (f"; view it with `mlflow ui --backend-store-uri {self.uri}` at "
                     f"{UI}/#/experiments/{self.experiment}?workflowType=machine_learning")
        return line


def default_uri(root: Path) -> str:
    """$MLFLOW_TRACKING_URI, else the embedded SQLite database at the project root."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(root / 'mlflow.db').resolve()}"
