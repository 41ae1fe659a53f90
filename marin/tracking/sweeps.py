"""The MLflow view of a ``marin sweep``: the sweep's own run (mirrored like any ledger run) is the
parent of one child run per trial, with the trial's params and last metrics, so that MLflow's
compare view sets the trials side by side. Children are made from the ledger's ``trial`` records,
once each (tag ``marin.trial_key``); the ``selection`` record tags the parent and the chosen child."""

from __future__ import annotations

from typing import Any

from marin.ledger.records import Record
from marin.tracking.naming import ms

TRIAL_NOTE = """One trial of a marin sweep (`marin sweep`): a DVC experiment (`marin.experiment`) whose stage runs
are the ledger runs in `marin.runs`, each tagged with the sweep's run id and this trial's index. Params: what the
trial changed from the baseline; metrics: the last values its runs recorded. `marin.status` failed means its
`dvc exp run` failed or was killed; its last metrics are kept."""


def _child(client: Any, exp: str, key: str) -> Any:
    found = client.search_runs([exp], filter_string=f"tags.`marin.trial_key` = '{key}'", max_results=1)
    return found[0] if found else None


def sync_trials(client: Any, exp: str, parent: str, sweep_id: str, records: list[Record]) -> None:
    """Children for the ``trial`` records among ``records`` (new to the mirror), tags for a ``selection``."""
    from mlflow.entities import Metric, Param, RunTag

    for r in records:
        b = r.body
        if r.kind == "selection" and b["trial"] is not None:
            rule = f"{b['rule']['goal']} {b['rule']['metric']}"
            client.log_batch(parent, tags=[RunTag("marin.selected_trial", str(b["trial"])),
                                           RunTag("marin.selection_rule", rule)])
            child = _child(client, exp, f"{sweep_id}:{b['trial']}")
            if child is not None:
                client.set_tag(child.info.run_id, "marin.selected", "true")
        if r.kind != "trial" or _child(client, exp, f"{sweep_id}:{b['index']}") is not None:
            continue
        changed = ", ".join(f"{k}={v}" for k, v in b["params"].items())
        run = client.create_run(exp, run_name=f"trial {b['index']} ({changed})", start_time=ms(r.time), tags={
            "mlflow.parentRunId": parent, "marin.kind": "trial", "marin.trial_key": f"{sweep_id}:{b['index']}",
            "marin.sweep": sweep_id, "marin.trial": str(b["index"]), "marin.status": b["status"],
            "marin.experiment": b["experiment"], "marin.runs": " ".join(x["run_id"] for x in b["runs"]),
            "mlflow.note.content": TRIAL_NOTE})
        step = int(b["metrics"].get("step", 0))
        client.log_batch(run.info.run_id, params=[Param(k[:250], str(v)) for k, v in b["params"].items()],
                         metrics=[Metric(k, float(v), ms(r.time), step) for k, v in b["metrics"].items()
                                  if k != "step"])
        client.set_terminated(run.info.run_id, "FINISHED" if b["status"] == "succeeded" else "FAILED",
                              end_time=ms(r.time))
