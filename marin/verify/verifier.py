"""``marin verify``: replay a recorded run from its ledger alone and compare it bit for bit.

Numbered steps, each with its own message, each a method of :class:`Verifier`:

1. the run: found, succeeded, its ledger file intact (schemas, chain, Merkle root);
2. the recipe: its digest recomputed from the fields of ``run.started``, and the input
   records agree with the recipe's inputs;
3. the workspace: a git worktree at the recorded commit, carrying the recorded params;
4. the inputs: restored by digest (from the worktree at the recorded commit, the DVC cache, the
   DVC remote, else the project's copy); recorded bytes found nowhere are exit 4, never a mismatch;
5. the determinism class: the recorded XLA thread count, XLA flags and allow-listed
   environment are restored; the device count and mesh follow from the restored params;
6. the replay: the recorded command (``--segments K``: K checkpoint intervals of a train
   run, drawn with a recorded seed, each from its starting checkpoint);
7. the comparison: every input, checkpoint, metric, eval and output digest or exact value,
   in recorded order, and for train runs the recorded checkpoint tensors on disk;
8. the verdict: a ``verification`` record is appended after ``run.finished``.

Exit 0: bit-exact. 1: a mismatch (the first diverging record, step and tensor are named).
3: the replay's determinism class differs from the recorded one; distances are reported
and the result is never called bit-exact. 4: the run cannot be verified here.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marin import env, hashing
from marin.errors import IntegrityError
from marin.ledger.bodies import InputBody, RunStarted, VerifiedRun
from marin.ledger.check import check_run
from marin.ledger.index import Index, seed, with_index
from marin.ledger.query import Ledger
from marin.ledger.records import Record
from marin.ledger.run import recipe_code, recipe_digest
from marin.ledger.store import NoSuchRun, RunFile, RunLog, load_run, read_all, resolve_run_id
from marin.paths import ledger_dir
from marin.remote import checkpoints_dir
from marin.stages import SOURCE_STAGES, TRAINING
from marin.verify import rounding, samples
from marin.verify.compare import Divergence, class_differences, compare, cpu_differences, metric_distances
from marin.verify.outcome import Outcome, Say, counts, json_run, render
from marin.verify.segments import check_segments, replay_segments, stage_args
from marin.verify.workspace import CannotVerify, InputUnavailable, Workspace


@with_index
def verify(root: Path, run_id: str, *, segments: int | None = None, seed: int | None = None,
           xla_flags: tuple[str, ...] = (), keep: bool = False, say: Say = print, signer: str | None = None,
           index: Index) -> Outcome:
    """Verify one run (steps 1-8) and append the verification record. ``index``: the command's
    ledger index (else one is opened for this run); ``signer``: the key id that will sign the
    record (``--sign``), written into it so that no other key's summary is backed by it."""
    t0 = time.perf_counter()
    index.refresh()
    log = _load(root, run_id)  # 1
    if segments is not None:
        check_segments(root, log, segments, index)
    out = Outcome(log.run_id, log.stage, "segments" if segments else "full", signer=signer)
    return Verifier(root, log, index, out, say, t0).run(segments, seed, xla_flags, keep)


def _load(root: Path, run_id: str) -> RunLog:
    """Step 1: the run, its ledger file intact, succeeded, and a replayable recipe."""
    try:
        run_id = resolve_run_id(root, run_id)  # a short id too: a unique prefix, the 8-hex tail MLflow shows
        log = load_run(root, run_id)
    except NoSuchRun as e:  # an ambiguous short id too, listing the runs it matches
        raise CannotVerify(f"step 1: {e}") from None
    problems = check_run(log)
    if problems:
        raise IntegrityError(f"step 1: {run_id}: the ledger file is not intact: {problems[0]}; "
                             "see `marin ledger check`")
    if log.status != "succeeded":
        raise CannotVerify(f"step 1: run {run_id} is {log.status}; only a succeeded run claims outputs to verify")
    if log.stage == "report":  # a view of the ledger at a snapshot, not a replayable recipe
        raise CannotVerify(f"step 1: run {run_id} built a report; check it with `marin report verify "
                           "reports/<model>` and `marin ledger check --since reports/<model>`")
    return log


@dataclass
class Verifier:
    """One verification of one loaded run (step 1 done): what every later step reads and writes.
    ``ws`` is set at step 3 and ``replay_env`` at step 5."""

    root: Path
    log: RunLog
    index: Index
    out: Outcome
    say: Say
    t0: float  # when the verification began
    ws: Workspace = field(init=False)
    replay_env: dict[str, str] = field(init=False)

    @property
    def started(self) -> RunStarted:
        return self.log.start_body

    def run(self, segments: int | None, seed: int | None, xla_flags: tuple[str, ...], keep: bool) -> Outcome:
        """Steps 2-8 (step 1 loaded the run)."""
        out, say, started = self.out, self.say, self.started
        say(f"verify {out.run_id} ({out.stage}, {out.mode})")
        say("  1. run: ledger file intact, run succeeded")

        out.divergences = self.check_recipe()  # 2
        if out.divergences:
            say(f"  2. recipe: MISMATCH {out.first}")
            return self.finish()
        say(f"  2. recipe: {started['recipe_digest']} recomputed from run.started")
        self.check_cpu()

        self.ws = Workspace.open(self.root, out.run_id, started, keep)  # 3
        try:
            self.replay(segments, seed, xla_flags)
        finally:
            self.ws.close()
        return self.finish()

    def check_recipe(self) -> list[Divergence]:
        """Step 2: the recorded recipe digest is the digest of the recorded recipe fields."""
        log = self.log
        s, seq = log.start_body, log.start.seq
        again = recipe_digest(s["stage"], s["command"], s["params"], recipe_code(s["code"]), s["inputs"],
                              s["determinism_class"])
        if again != s["recipe_digest"]:
            return [Divergence(seq, "run.started", f"recipe digest {s['recipe_digest']} is not the digest of the "
                               f"recorded stage, command, params, code, inputs and class ({again}): run.started was "
                               "edited", recorded=s["recipe_digest"], replayed=again, independent=True)]
        code = s["code"]  # closure and closure_digest are recorded together (env.code_state)
        closure = code.get("closure")
        if closure is not None and hashing.files_map_digest(closure) != code.get("closure_digest"):
            return [Divergence(seq, "run.started", "code.closure_digest is not the digest of the recorded closure's "
                               "files: run.started was edited", independent=True)]
        if env.class_digest(s["determinism_class"]) != s["determinism_digest"]:
            return [Divergence(seq, "run.started", "determinism_digest is not the digest of the recorded class: "
                               "run.started was edited", recorded=s["determinism_digest"], independent=True)]
        by_name = {r.body_as("input")["name"]: r for r in log.of_kind("input")}
        found: list[Divergence] = []
        for i in s["inputs"]:
            r = by_name.get(i["name"])
            if r is None or r.body_as("input")["digest"] != i["digest"]:
                found.append(Divergence(r.seq if r else seq, "input", f"the input record does not match the recipe's "
                                        f"input {i['digest']}", name=i["name"], recorded=i["digest"], independent=True))
        return found

    def check_cpu(self) -> None:
        """A run recorded under the portable profile replays only on a CPU at its level (exit 4 below it)."""
        from marin import cpu

        det = self.started["determinism_class"]
        if det.get("profile") != "portable":
            return
        level = det.get("isa_level")  # the portable profile records it
        if level is None:
            raise CannotVerify(f"step 5: run {self.out.run_id} says it ran under the portable profile but records "
                               "no isa_level (its determinism_class was edited?); it cannot be replayed as it ran")
        missing = cpu.missing_for(level)
        if missing:
            raise CannotVerify(f"step 5: run {self.out.run_id} was recorded under the portable profile at "
                               f"{level}; this CPU ({cpu.model()}) lacks {', '.join(missing)}: "
                               "verify it on a CPU that has them")

    def replay(self, segments: int | None, seed: int | None, xla_flags: tuple[str, ...]) -> None:
        """Steps 3-7 in the open workspace."""
        ws, out, say = self.ws, self.out, self.say
        say(f"  3. workspace: git worktree at {ws.commit[:12]} with the recorded params")
        self.restore_inputs(Ledger(self.root, self.index, sources=SOURCE_STAGES))  # 4
        self.replay_env = ws.env(self.started, list(xla_flags))  # 5
        self.replay_env.update(rounding.replay_env(self.root, self.log, self.index))  # universal: its log
        out.verifier = {"workspace": f"git worktree at {ws.commit}", "inputs": ws.restored,
                        "forced": {"xla_flags": list(xla_flags)} if xla_flags else {}}
        say(f"  5. determinism class: XLA_FLAGS={self.replay_env.get('XLA_FLAGS', '')!r} "
            f"NPROC={self.replay_env.get('NPROC', '(unset)')}")
        t1 = time.perf_counter()
        if segments:  # 6, 7
            replay_segments(self, segments, seed)
        else:
            self.replay_full()
        out.seconds["replay_s"] = round(time.perf_counter() - t1, 3)

    def restore_inputs(self, ledger: Ledger) -> None:
        """Step 4: every input put in the workspace by digest. An input whose recorded bytes are nowhere
        here is CannotVerify (exit 4): the run is not shown wrong by a copy that changed since, so no
        verdict is recorded against it."""
        by_name = {r.body_as("input")["name"]: r for r in self.log.of_kind("input")}
        producers = ledger.producers_of  # digest -> the runs that output it
        for i in self.started["inputs"]:
            body = by_name[i["name"]].body_as("input")
            try:
                source = self.ws.restore_input(body, _entries(producers, body["digest"]))
            except InputUnavailable as e:
                raise CannotVerify(f"step 4: cannot verify here: {e}; {_restore_hint(ledger, body)}") from None
            self.say(f"  4. input {i['name']}: restored from {source}")

    def replay_full(self) -> None:
        """Steps 6-7 without --segments: the recorded command in the workspace, then every record compared."""
        log, ws, out, started = self.log, self.ws, self.out, self.started
        module = _module(started["command"])
        self.say(f"  6. replay: python -m {module} {' '.join(started['command'][1:])}".rstrip())
        ws.run(["-m", module, *started["command"][1:]], self.replay_env, f"step 6: the replay of {log.run_id}",
               progress=True)
        replay = self.replayed_run()
        rs = replay.start_body
        out.class_diffs = class_differences(started["determinism_class"], rs["determinism_class"])
        out.compared, out.divergences = compare(log, replay)
        out.divergences = sorted(_started_fields(log, rs) + out.divergences
                                 + samples.check(self.root, ws.root, log, out.divergences), key=lambda d: d.seq)
        if out.stage in TRAINING:
            self.checkpoint_tensors(replay)
            rounding.explain(out, log, self.replay_env)  # a changed rounding log: named at its entry
        else:  # a scoring stage's log (universal): named at its entry
            rounding.explain_scoring(out, log, self.replay_env, ws.root)
        if out.class_diffs:
            out.distances = {"metrics": metric_distances(log, replay), **(out.distances or {})}
        self.say(f"  7. compared {sum(out.compared.values())} records ({counts(out.compared)})")

    def replayed_run(self) -> RunLog:
        """Step 6: the one run the replay left in the workspace's ledger, of the recorded code and params."""
        started, out, ws = self.started, self.out, self.ws
        replays = [r for r in read_all(ledger_dir(ws.root)) if r.started and r.stage == out.stage]
        if len(replays) != 1 or replays[0].status != "succeeded":
            raise CannotVerify(f"step 6: the replay left {len(replays)} {out.stage} run(s) in {ledger_dir(ws.root)}, "
                               "expected one that succeeded")
        replay = replays[0]
        rs = replay.start_body
        out.replay_run_id = replay.run_id
        out.verifier.update(env=rs["env"], code=rs["code"], determinism_class=rs["determinism_class"])
        if rs["code"]["code_digest"] != started["code"]["code_digest"]:
            raise CannotVerify(f"step 6: the workspace's code digest {rs['code']['code_digest']} is not the recorded "
                               f"{started['code']['code_digest']}")
        if rs["params"] != started["params"]:
            raise CannotVerify("step 6: the replay did not read the recorded params; params.yaml at commit "
                               f"{(started['code']['git_commit'] or '')[:12]} lacks a recorded section")
        return replay

    def checkpoint_tensors(self, replay: RunLog) -> None:
        """Tensor by tensor: the recorded run's checkpoints on disk against the replay's. Catches a
        checkpoint changed on disk, and names the tensor where digests diverge."""
        out = self.out
        recs, replayed = self.log.of_kind("checkpoint"), replay.of_kind("checkpoint")
        if not recs or not replayed:
            return
        on_disk = checkpoints_dir(self.root, self.log, self.index)  # the project's, else the published ones
        replay_dir = self.ws.root / Path(replayed[0].body_as("checkpoint")["path"]).parent
        if not on_disk.is_dir():
            out.verifier["tensor_pass"] = f"skipped: the recorded checkpoints ({on_disk}) are not on this machine"
            return
        result = self.tensor_pass(on_disk, replay_dir, recs, replayed)
        by_step = {d.step: d for d in out.divergences if d.kind == "checkpoint"}
        tensor_max: dict[str, dict[str, float]] = {}
        missing: list[int] = []
        for r in recs:
            b = r.body_as("checkpoint")
            s, rec_digest = b["step"], b["digest"]
            res = result[str(s)]
            dist: dict[str, Any] = res["distances"] or {}
            _widen(tensor_max, dist)
            if res["a_digest"] is None:
                missing.append(s)
                continue
            first = next(iter(sorted(dist)), None)
            if res["a_digest"] != rec_digest:
                out.divergences.append(Divergence(
                    r.seq, "checkpoint", f"the checkpoint files at {b['path']} restore to {res['a_digest']}, "
                    f"not the recorded {rec_digest} (changed on disk)", step=s, tensor=first,
                    recorded=rec_digest, replayed=res["a_digest"], independent=True))
            elif s in by_step and first is not None:
                by_step[s].tensor = first
                by_step[s].what += f"; first differing tensor {first}: max |diff| {dist[first]['max_abs']:.3g}"
                by_step[s].index = dist[first].get("first_index")  # None from a tool that names none
        out.compared["checkpoint_tensors"] = len(recs) - len(missing)
        if out.class_diffs:
            out.distances = {"tensors": tensor_max,
                             "note": f"recorded checkpoints missing on disk at steps {missing}" if missing else ""}

    def tensor_pass(self, on_disk: Path, replay_dir: Path, recs: list[Record],
                    replayed: list[Record]) -> dict[str, Any]:
        """The replay tool's tensor comparison of the recorded checkpoints with the replay's, by step;
        the tool must see the replay's checkpoints as the replay recorded them."""
        steps = ",".join(str(r.body_as("checkpoint")["step"]) for r in recs)
        result = json_run(self.ws, self.replay_env, ["compare", "--a", str(on_disk), "--b", str(replay_dir),
                                                     "--steps", steps,
                                                     *stage_args(self.out.stage)], self.out)
        own = {b["step"]: b["digest"] for b in (r.body_as("checkpoint") for r in replayed)}
        for s, res in result.items():
            if own.get(int(s)) is not None and res["b_digest"] != own[int(s)]:
                raise CannotVerify(f"step 7: the tensor pass restores the replay's checkpoint {s} as "
                                   f"{res['b_digest']}, but the replay recorded {own[int(s)]}; the comparison tool "
                                   "is not trustworthy here")
        return result

    def finish(self) -> Outcome:
        """Step 8: append the verification record and say the verdict."""
        log, out = self.log, self.out
        out.seconds["total_s"] = round(time.perf_counter() - self.t0, 3)
        if not out.verifier:
            out.verifier = {"workspace": "none: stopped before the replay"}
        out.verifier.setdefault("env", env.fingerprint())
        out.verifier.setdefault("code", log.code)
        out.verifier.setdefault("determinism_class", {})
        out.cpu = cpu_differences(log.env, out.verifier["env"])
        if out.verified_nothing:
            raise CannotVerify(f"step 7: the replay of {log.run_id} compared no record: nothing was verified, so "
                               "nothing is recorded; check that the recorded command writes its records, and retry")
        file = RunFile(log.path, log.run_id, functools.partial(seed, log.path, log.run_id, self.index))
        verified = VerifiedRun(run_id=log.run_id, recipe_digest=log.recipe_digest,
                               finished_digest=log.end.digest)
        rec = file.append("verification", json.loads(json.dumps(out.body(verified), default=str)))
        out.record_seq = rec.seq
        for line in render(out):
            self.say(line)
        return out


def _entries(producers: Callable[[str], list[Any]], digest: str) -> list[dict[str, Any]] | None:
    """The file list a producing run recorded for a directory with this digest."""
    return next((found for _, body in producers(digest) if (found := body.get("entries")) is not None), None)


def _restore_hint(ledger: Ledger, body: InputBody) -> str:
    """What to do about an input whose recorded bytes are nowhere: the project's copy changed since
    the run (a later version, recorded or not), or is gone."""
    here = ledger.root / body["path"]
    if not here.exists():
        return "restore it (git checkout, dvc pull or dvc checkout) and retry"
    later = ledger.producers_of(hashing.path_digest(here))
    if later:
        return (f"the project holds the version run {later[-1][0].run_id} produced: restore the recorded one "
                "(dvc checkout, or keep a DVC cache or remote) and retry")
    return (f"{body['path']} changed since the run: put the recorded bytes back (git checkout of the recorded "
            "commit, dvc pull) and retry")


def _module(command: list[str]) -> str:
    script = command[0]
    if not (script.startswith("pipeline/") and script.endswith(".py")):
        raise CannotVerify(f"step 6: recorded command {command} is not a pipeline stage (pipeline/<stage>.py)")
    return script.removesuffix(".py").replace("/", ".")


def _widen(tensor_max: dict[str, dict[str, float]], dist: dict[str, Any]) -> None:
    """Raise each tensor's largest distances so far to those of one more checkpoint."""
    for name, d in dist.items():
        if d.get("max_abs") is not None:
            cur = tensor_max.setdefault(name, {"max_abs": 0.0, "max_rel": 0.0})
            cur["max_abs"], cur["max_rel"] = max(cur["max_abs"], d["max_abs"]), max(cur["max_rel"], d["max_rel"])


def _started_fields(log: RunLog, replayed: RunStarted) -> list[Divergence]:
    """What run.started claims beyond the recipe digest, against what the replay recorded: the
    derived seeds and the code state (commit, tree, lock file)."""
    s, out = log.start_body, list[Divergence]()
    if replayed["seeds"] != s["seeds"]:
        out.append(Divergence(log.start.seq, "run.started", "the recorded seeds are not those the recorded "
                              "params derive", name="seeds", independent=True))
    keys = ("git_commit", "tree_digest", "code_digest", "lock_digest")
    bad = [k for k in keys if replayed["code"].get(k) != s["code"].get(k)]
    if bad:
        recorded, found = [s["code"].get(k) for k in bad], [replayed["code"].get(k) for k in bad]
        out.append(Divergence(log.start.seq, "run.started", f"code {', '.join(bad)} recorded {recorded}, the "
                              f"commit has {found}", name="code", independent=True))
    return out
