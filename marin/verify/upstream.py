"""``marin verify --upstream TARGET``: the run behind TARGET and every run in its lineage,
upstream first, verified one by one, then one table and the most serious exit code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from marin.errors import MarinError
from marin.ledger.index import Index, with_index
from marin.ledger.query import Ledger
from marin.stages import SOURCE_STAGES, TRAINING
from marin.verify.outcome import Outcome, Say
from marin.verify.verifier import verify
from marin.verify.workspace import CannotVerify

Row = tuple[str, str, Outcome | MarinError]  # stage, run id, what verifying it gave


@with_index
def verify_upstream(root: Path, target: str, say: Say = print, *, index: Index, **kw: Any) -> list[Row]:
    """Verify TARGET's run and every run in its lineage, upstream first, then print one table.
    ``index``: the command's ledger index (else one is opened), shared by every run verified."""
    from marin.ledger.query import LineageError, upstream

    index.refresh()
    ledger = Ledger(root, index, sources=SOURCE_STAGES)
    try:
        resolved = ledger.resolve(target)
    except LineageError as e:
        raise CannotVerify(str(e)) from None
    if resolved.note:  # a path whose bytes no run recorded: verifying its last writer proves nothing about it
        raise CannotVerify(f"{resolved.note}; verify the run id instead, or restore the file (dvc checkout)")
    steps = upstream(ledger.node(resolved))
    if not steps:
        raise CannotVerify(f"{target}: no run in the ledger produced it; nothing to verify")
    rows: list[Row] = []
    for s in steps:
        try:
            opts = kw if s.stage in TRAINING else {k: v for k, v in kw.items() if k not in ("segments", "seed")}
            rows.append((s.stage, s.run_id, verify(root, s.run_id, say=say, index=index, **opts)))
        except MarinError as e:
            say(f"verify {s.run_id}: {e}")
            rows.append((s.stage, s.run_id, e))
    say("")
    w, r = max(len("stage"), *(len(s) for s, _, _ in rows)), max(len("run id"), *(len(i) for _, i, _ in rows))
    say(f"{'stage':{w}} {'run id':{r}} {'result':14} {'compared':>8}  first divergence")
    for stage, run_id, o in rows:
        if isinstance(o, Outcome):
            say(f"{stage:{w}} {run_id:{r}} {o.result:14} {sum(o.compared.values()):8}  {o.first or ''}")
        else:
            say(f"{stage:{w}} {run_id:{r}} {'error ' + str(o.exit_code):14} {'':8}  {str(o)[:200]}")
    return rows


def upstream_exit(rows: list[Row]) -> int:
    """The most serious exit code of the rows: 1 (mismatch or broken ledger), then 4, then 3."""
    codes = [o.exit_code for _, _, o in rows]
    for c in (1, 4, 3):
        if c in codes:
            return c
    return 0
