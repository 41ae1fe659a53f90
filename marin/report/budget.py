"""The training budget as facts: epochs (tokens seen over the training split's tokens) and tokens
per parameter, derived from the train run and the tokenize manifest; the sentences of the report
and the card that state them (Compute, and the memorisation risk)."""

from __future__ import annotations

from typing import Any

from marin.report.facts import Context, Facts
from marin.report.page import V

EPOCHS = "tokens seen / training tokens"
# What the hours above leave out: the ledger times each run from its plan (inputs digested) to its last record
WALL_TIME_SCOPE = (
    "The wall times, and the hours and energy computed from them, are the runs' own (`wall_s` of each run's "
    "`run.finished` record: from the run's plan, its inputs digested, to its last record). Outside them: each "
    "stage's process start and imports, DVC's own hashing and `dvc.lock` writes, and the time between stages. "
    "The ledger measures none of these on the clock, so the pipeline took longer than these figures say, by an "
    "amount this report does not know; the measured process CPU time includes each stage process's start and "
    "imports, but not DVC's work or the time between stages.")
PER_PARAM = "tokens seen / parameters"


def facts(f: Facts, c: Context) -> dict[str, Any]:
    """Fact ids of the training tokens, the epochs and the tokens per parameter; whether the epochs
    exceed one (the wording of the memorisation risk follows it)."""
    doc = c.doc
    items = f.items
    seen, train = items[doc["training"]["tokens_seen"]], items[doc["data"]["splits"]["train"]["tokens"]]
    epochs = f.derive("epochs (times the training tokens were read)", EPOCHS, [seen, train])
    return {"train_tokens": train.id, "epochs": epochs.id, "several_epochs": epochs.value > 1,
            "tokens_per_param": f.derive("tokens seen per parameter", PER_PARAM,
                                         [seen, items[doc["model"]["n_params"]]]).id}


def compute_line(v: V, doc: dict[str, Any]) -> str:
    b = doc["budget"]
    return (f"Training read {v(b['epochs'])} epochs of its {v(b['train_tokens'])} training tokens (tokens seen over "
            f"unique training tokens) and saw {v(b['tokens_per_param'])} tokens per parameter.")


def memorisation_risk(v: V, doc: dict[str, Any]) -> str:
    """The memorisation risk, stated with the run's own number of epochs."""
    b = doc.get("budget")
    if b is None:
        return "- Memorisation: passages of the training texts can be regenerated verbatim."
    if b["several_epochs"]:
        said = (f"training read its {v(b['train_tokens'])} training tokens {v(b['epochs'])} times over (epochs), so "
                "passages of the training texts can be regenerated verbatim")
    else:
        said = (f"training read {v(b['epochs'])} of an epoch of its {v(b['train_tokens'])} training tokens; "
                "repeated passages can still be regenerated verbatim")
    return f"- Memorisation: {said} (their licences are listed under Data)."
