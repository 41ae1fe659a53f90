"""The ledger's read API: runs by id, the runs that produced or read each digest, a TARGET
(run id, digest or unique prefix, path) resolved, and the lineage graph behind it.

Lineage needs no shared ids: a run's input digest names the run whose output had that
digest (the latest succeeded one among those started before it). Runs of a source stage
(``fetch``) read from outside the ledger, so their inputs are the leaves: the raw archives,
with their locator and license; which stages those are is the caller's to say (``sources``:
:data:`marin.stages.SOURCE_STAGES`), as the ledger knows no pipeline. ``marin lineage``, verify, report and
publish read the ledger through here; the derived index (built once per command) is passed down.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from marin import hashing
from marin.errors import MarinError
from marin.fsutil import not_regular
from marin.ledger import listing
from marin.ledger.hash_cache import HashCache
from marin.ledger.index import Entity, Index, RunRow
from marin.ledger.store import AmbiguousRun, NoSuchRun, RunLog, load_run, resolve_run_id
from marin.paths import relpath

MIN_PREFIX = 8  # shortest hex prefix accepted as a digest target
Found = tuple[RunLog, dict[str, Any]]  # a run and one of its input or output record bodies


class LineageError(MarinError):
    """A lineage target cannot be resolved."""


class UnknownTarget(LineageError):
    """No run, digest or recorded path matches the target."""


class AmbiguousTarget(LineageError):
    """A digest prefix matches more than one digest."""


@dataclass(eq=False)
class Artifact:
    """An entity: bytes named by their digest, as a run recorded them."""

    digest: str
    name: str
    path: str
    size: int | None = None
    locator: str | None = None  # where a raw archive came from (leaves only)
    license: str | None = None
    run: Step | None = None  # the run that generated it; None: from outside the ledger
    # a model's second identity: ``digest`` is its folder digest (its files), this the sha256 over its tensors
    tensor_digest: str | None = None


@dataclass(eq=False)
class Step:
    """An activity: one run of one stage. Shared upstream runs are one object (a DAG)."""

    run_id: str
    stage: str
    status: str
    recipe_digest: str
    code: dict[str, Any]
    env: dict[str, Any]
    started: str
    finished: str | None
    inputs: list[Artifact] = field(default_factory=list)
    outputs: list[Artifact] = field(default_factory=list)


@dataclass(frozen=True)
class Target:
    """What a TARGET names: a run id or a full digest; ``note`` when a path matched by name only."""

    kind: str  # "run" or "digest"
    key: str
    note: str | None = None
    changed: bool = False  # the path's bytes on disk are none of its recorded versions (they have no lineage)


PRODUCED = ("output", "checkpoint")  # index roles whose digest a run generated


class IndexLike(Protocol):
    """What the ledger's readers ask of an index: :class:`Index` itself, or a view of it
    (:class:`marin.ledger.asof.AsOfIndex`: the index as a snapshot holds it)."""

    def run(self, run_id: str) -> RunRow | None: ...

    def runs(self, stage: str | None = None, include_unstarted: bool = False,
             last: int | None = None) -> list[RunRow]: ...

    def entities(self, *, digest: str | None = None, run_id: str | None = None, path: str | None = None,
                 role: str | None = None) -> list[Entity]: ...

    def digests_with_prefix(self, prefix: str, limit: int = 6) -> list[str]: ...

    def unreadable(self) -> dict[str, str]: ...

    @property
    def whole(self) -> Index: ...  # the index viewed: the file hashes it keeps are the same in every view


class Runs(Mapping[str, RunLog]):
    """Run files by id, read (parsed, not validated) when first asked for: a command touches
    only the runs it needs, whatever the size of the ledger."""

    def __init__(self, root: Path, index: IndexLike, skip: tuple[str, ...] = ()):
        self._root, self._index, self._skip = root, index, skip
        self._logs: dict[str, RunLog] = {}

    def __getitem__(self, run_id: str) -> RunLog:
        if run_id not in self._logs:
            row = self._index.run(run_id)
            if row is None or row.stage is None:
                raise KeyError(run_id)
            self._logs[run_id] = load_run(self._root, run_id, validate=False, skip=self._skip)
        return self._logs[run_id]

    def is_read(self, run_id: str) -> bool:
        """Whether run ``run_id`` was read already (asking ``in`` reads it)."""
        return run_id in self._logs

    def __iter__(self) -> Iterator[str]:
        return (r.run_id for r in self._index.runs() if r.stage is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Ledger:
    """The ledger as its readers see it: runs by id, and the runs that produced or read each digest,
    looked up in the derived index (built once per command and passed down). Use it in a ``with`` block:
    an index it opened itself is closed at the block's end."""

    def __init__(self, root: Path, index: IndexLike | None = None, *, sources: Collection[str],
                 skip: tuple[str, ...] = ()):
        """``sources``: the stages whose inputs come from outside the ledger (lineage ends at them);
        ``skip``: record kinds the caller never reads (``marin lineage`` skips metrics, so a
        million-record training run costs what its inputs and outputs cost)."""
        self.root, self.sources = Path(root), frozenset(sources)
        self._owned: Index | None = None
        if index is None:
            index = self._owned = Index.open(self.root)
        self.index = index
        self.hashes = HashCache(self.root, index=self.index.whole)  # file digests, kept in the index
        self.runs = Runs(self.root, self.index, skip)
        self._steps: dict[str, Step] = {}

    def close(self) -> None:
        """Close the index this ledger opened (not one passed in)."""
        if self._owned is not None:
            self._owned.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def producers_of(self, digest: str) -> list[Found]:
        """Every (run, output body) that generated ``digest``, oldest run first."""
        found = [(self.runs[r], b) for r, _, role, b in self.index.entities(digest=digest) if role in PRODUCED]
        return sorted(found, key=lambda c: (c[0].records[0].time, c[0].run_id))

    def resolve(self, target: str) -> Target:
        """A run id (or a short one: :func:`marin.ledger.store.resolve_run_id`), a digest
        (``sha256:<hex>`` or a unique hex prefix of 8+ digits), or a path."""
        if self.runs.is_read(target) or (self.index.run(target) or _NO_RUN).stage is not None:
            return Target("run", target)
        run = None if os.path.lexists(self.root / target) else self._short_run(target)  # a path's name wins
        hexpart = target.removeprefix("sha256:")
        if len(hexpart) >= MIN_PREFIX and re.fullmatch("[0-9a-f]+", hexpart):
            found = self.index.digests_with_prefix(f"sha256:{hexpart}")
            if len(found) > 1 or (found and run is not None):
                shown = ", ".join([*([f"run {run}"] if run else []), *(f"sha256:{d[7:19]}" for d in found[:5])])
                more = "" if len(found) < 6 else " or more"
                raise AmbiguousTarget(f"digest prefix {target!r} is ambiguous: {len(found)}{more} digests "
                                      f"{'and a run ' if run else ''}match ({shown}); give more digits")
            if found:
                return Target("digest", found[0])
        if run is not None:
            return Target("run", run)
        return self._resolve_path(target)

    def _short_run(self, target: str) -> str | None:
        """The started run that a short run id names (a unique prefix, the 8-hex tail), else None."""
        try:
            run_id = resolve_run_id(self.root, target)
        except AmbiguousRun as e:
            raise AmbiguousTarget(str(e)) from None
        except NoSuchRun:
            return None
        return run_id if (self.index.run(run_id) or _NO_RUN).stage is not None else None

    def _resolve_path(self, target: str) -> Target:
        path = Path(target) if Path(target).is_absolute() else self.root / target
        rel = relpath(self.root, path)
        _refuse_special(path, target)
        if path.exists():
            digest = hashing.digest_path(path, self.hashes).digest
            if self.producers_of(digest):
                return Target("digest", digest)
        recorded = [(self.runs[r], b) for r, _, role, b in self.index.entities(path=rel) if role in PRODUCED]
        if not recorded and (inside := self._inside_output(path, rel)) is not None:
            return inside
        if not recorded:
            raise UnknownTarget(f"{target!r} is not a run id, a digest or a path that any run in the ledger "
                                "wrote; see `marin ledger log`")
        log, body = _latest(recorded)
        why = "differs from every recorded output" if path.exists() else "does not exist"
        return Target("digest", body["digest"], f"{rel} {why}; showing what run {log.run_id} wrote there",
                      changed=path.exists())

    def _inside_output(self, path: Path, rel: str) -> Target | None:
        """A file inside a recorded directory output (``models/final/model.safetensors``): the version of the
        directory whose recorded entry the file's bytes are, else (changed) the latest that lists it."""
        for folder in Path(rel).parents:
            if folder == Path("."):
                return None
            rows = [(self.runs[r], b) for r, _, role, b in self.index.entities(path=folder.as_posix())
                    if role in PRODUCED]
            if not rows:
                continue
            name = Path(rel).relative_to(folder).as_posix()
            digest = hashing.digest_path(path, self.hashes).digest if path.is_file() else None
            listed = [(log, b, e["digest"]) for log, b in rows for e in listing.entries(self.root, b)
                      if e["path"] == name]
            if not listed:
                return None
            same = [(log, b) for log, b, d in listed if d == digest]
            log, body = _latest(same or [(log, b) for log, b, _ in listed])
            why = "is a file of" if same else "differs from every recorded version in" if path.exists() else \
                "does not exist; recorded in"
            return Target("digest", body["digest"], f"{rel} {why} {folder.as_posix()}, which run {log.run_id} "
                          "wrote; showing its lineage", changed=bool(path.exists() and not same))
        return None

    def node(self, target: Target) -> Artifact | Step:
        """The lineage tree of a resolved target."""
        return self.step(target.key) if target.kind == "run" else self._artifact(target.key)

    def _producer(self, digest: str, reader: RunLog | None) -> Found | None:
        if reader is not None and reader.records[0].body["stage"] in self.sources:
            return None
        cands = [c for c in self.producers_of(digest)
                 if reader is None or c[0].records[0].time < reader.records[0].time]
        return _latest(cands) if cands else None

    def _artifact(self, digest: str, reader: RunLog | None = None, used: dict[str, Any] | None = None) -> Artifact:
        """The entity ``digest``, named as ``reader`` read it (``used``), with its producing run."""
        producer = self._producer(digest, reader)
        if producer is None:
            b = used or next(b for _, _, role, b in self.index.entities(digest=digest) if role == "input")
            return Artifact(digest, b["name"], b["path"], b.get("size"), b.get("locator"), b.get("license"))
        log, out = producer
        b = used or out
        return Artifact(digest, b["name"], b["path"], b.get("size"), run=self.step(log.run_id),
                        tensor_digest=out.get("tensor_digest"))

    def step(self, run_id: str) -> Step:
        """The run ``run_id`` as a lineage step, its inputs traced upstream."""
        if run_id in self._steps:
            return self._steps[run_id]
        log = self.runs[run_id]
        s = log.records[0]
        step = Step(run_id, s.body["stage"], log.status, s.body["recipe_digest"], s.body["code"], s.body["env"],
                    s.time, log.finished.time if log.finished else None)
        self._steps[run_id] = step  # before the inputs: an upstream run shared by two inputs is built once
        step.outputs = [Artifact(b["digest"], b["name"], b["path"], b.get("size"), run=step,
                                 tensor_digest=b.get("tensor_digest")) for b in _outputs(log)]
        step.inputs = [self._artifact(r.body["digest"], log, r.body) for r in log.of_kind("input")]
        return step


_NO_RUN = RunRow("", None, None, None, "unfinished", None, 0, None, None)


def _outputs(log: RunLog) -> list[dict[str, Any]]:
    """Output records of a run, checkpoints included (their digest is over the restored tensors)."""
    outs = [r.body for r in log.of_kind("output")]
    outs += [{"name": f"checkpoint:{r.body['step']}", "path": r.body["path"], "digest": r.body["digest"]}
             for r in log.of_kind("checkpoint")]
    return outs


def _latest(candidates: list[Found]) -> Found:
    """The latest succeeded run among candidates, else the latest one."""
    return max(candidates, key=lambda c: (c[0].status == "succeeded", c[0].records[0].time))


def _refuse_special(path: Path, target: str) -> None:
    """A device, fifo or socket is never read (``/dev/zero`` has no end, a fifo blocks)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    why = None if stat.S_ISDIR(mode) else not_regular(mode)
    if why is not None:
        raise UnknownTarget(f"{target}: {why}, not a file or folder; lineage is of a run id, a digest, "
                            "or a file or folder a run wrote")


def resolve(root: Path, target: str, sources: Collection[str]) -> Target:
    """Resolve TARGET (run id, digest or unique prefix, path) against the ledger under ``root``."""
    with Ledger(root, sources=sources) as ledger:
        return ledger.resolve(target)


def tree(root: Path, target: str, sources: Collection[str]) -> Artifact | Step:
    """The lineage tree of TARGET: an Artifact (digest, path) or a Step (run id), down to raw archives
    (the inputs of the ``sources`` stages)."""
    with Ledger(root, sources=sources) as ledger:
        return ledger.node(ledger.resolve(target))


def upstream(*nodes: Artifact | Step) -> list[Step]:
    """Every run the nodes depend on (and the nodes' own runs), each once, oldest first."""
    found: dict[str, Step] = {}
    todo = [node.run if isinstance(node, Artifact) else node for node in nodes]
    while todo:
        step = todo.pop()
        if step is not None and step.run_id not in found:
            found[step.run_id] = step
            todo.extend(a.run for a in step.inputs)
    return sorted(found.values(), key=lambda s: (s.started, s.run_id))
