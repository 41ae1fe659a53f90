"""MLflow as the browsable view of the ledger (the ledger stays the source of truth).

One MLflow run per ledger run, nested under a parent run per pipeline (git commit and
uncommitted-diff digest); params, metrics with their steps (``log_batch``), tags, input
datasets with their context, the ledger file and manifests as artifacts, and the model
as an MLflow LoggedModel pointing at ``models/final``. Sync is idempotent: each MLflow
run carries the seq and digest of the last ledger record it reflects, and a run whose
ledger has not grown is not touched.
"""

from marin.tracking.sync import SyncReport, default_uri, sync, sync_quietly

__all__ = ["SyncReport", "default_uri", "sync", "sync_quietly"]
