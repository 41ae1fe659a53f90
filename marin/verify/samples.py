"""Step 7 for the evaluate stage's per-sample log (``evals/harness/samples.jsonl``,
:mod:`marin.evaluate.harness_files`): the project's copy against its recorded digest and against
the replay's, the first differing sample named by task and document. A samples file edited after
the run (an answer changed, a document dropped) is a divergence even when the replay repeats the
recorded digest; a replay whose samples differ has its output divergence told which sample."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from marin import hashing, readers
from marin.evaluate.harness_files import first_difference
from marin.ledger.store import RunLog
from marin.verify.compare import Divergence
from marin.verify.workspace import CannotVerify

NAMES = ("harness_samples",)  # output records of per-sample logs


def _lines(path: Path) -> Iterable[bytes]:
    return readers.lines(path, "samples", CannotVerify) if path.is_file() else iter(())


def check(root: Path, replay_root: Path, log: RunLog, found: list[Divergence]) -> list[Divergence]:
    """Divergences for the recorded per-sample outputs: the project's file changed since the run
    (named sample: the project's copy against the replay's), and the named sample added to an
    output divergence of ``found`` (the replay's digest is not the recorded one)."""
    out: list[Divergence] = []
    for rec in log.of_kind("output"):
        body = rec.body_as("output")
        if body["name"] not in NAMES:
            continue
        path = body["path"]
        here, there = root / path, replay_root / path
        if not here.is_file():
            continue  # not on this machine: the replay's digest was compared with the record's
        recorded, now = body["digest"], hashing.file_digest(here)
        if now != recorded:
            which = first_difference(_lines(here), _lines(there)) or "every sample as replayed"
            out.append(Divergence(rec.seq, "output", f"{path} in the project hashes to {now}, not the recorded "
                                  f"{recorded} (changed on disk); first differing sample against the replay: {which}",
                                  name=body["name"], recorded=recorded, replayed=now, independent=True))
            continue
        for d in found:
            if d.seq == rec.seq and d.kind == "output":
                which = first_difference(_lines(here), _lines(there))
                d.what += f"; first differing sample: {which}" if which else ""
    return out
