"""What a verification found, and running the replay tool in a workspace."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from marin import readers
from marin.ledger.bodies import ClassDifference, CpuDifference, Segments, VerificationBody, VerifiedRun
from marin.verify.compare import Divergence, describe_cpu
from marin.verify.workspace import CannotVerify, Workspace

Result = Literal["bit-exact", "mismatch", "class-differs"]
EXIT: dict[Result, Literal[0, 1, 3]] = {"bit-exact": 0, "mismatch": 1, "class-differs": 3}


@dataclass
class Outcome:
    """What a verification found; ``body`` is the verification record appended to the run."""

    run_id: str
    stage: str
    mode: Literal["full", "segments"] = "full"
    divergences: list[Divergence] = field(default_factory=list)
    class_diffs: list[ClassDifference] = field(default_factory=list)
    compared: dict[str, int] = field(default_factory=dict)
    distances: dict[str, Any] | None = None
    segments: Segments | None = None
    verifier: dict[str, Any] = field(default_factory=dict)
    replay_run_id: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    record_seq: int | None = None
    cpu: CpuDifference | None = None  # how the verifier's CPU differs from the recorder's (None: the same)
    signer: str | None = None  # the key id that will sign the record (marin verify --sign), recorded in it

    @property
    def result(self) -> Result:
        """Bit-exact when every compared value agrees, whatever else differs between the machines
        (the record says how). A divergence that no class difference explains (an edited, missing or
        extra record, a checkpoint changed on disk, any divergence in the same class) is a mismatch."""
        if any(d.independent for d in self.divergences):
            return "mismatch"
        if not self.divergences:
            return "bit-exact"
        return "class-differs" if self.class_diffs else "mismatch"

    @property
    def verified_nothing(self) -> bool:
        """No divergence, but no record compared either: no verdict at all (never BIT-EXACT)."""
        return not self.divergences and not any(n > 0 for n in self.compared.values())

    @property
    def exit_code(self) -> Literal[0, 1, 3]:
        return EXIT[self.result]

    @property
    def first(self) -> Divergence | None:
        return min(self.divergences, key=lambda d: d.seq) if self.divergences else None

    def body(self, verified: VerifiedRun) -> VerificationBody:
        """Step 8: the verification record's body, of the run ``verified`` names."""
        body = VerificationBody(
            verified=verified, mode=self.mode, result=self.result, exit_code=self.exit_code, verifier=self.verifier,
            compared=self.compared, first_divergence=self.first.to_dict() if self.first else None, time=self.seconds)
        if self.cpu:
            body["cpu"] = self.cpu
        if self.class_diffs:
            body["class_differences"] = self.class_diffs
            body["distances"] = self.distances or {}
        if self.segments:
            body["segments"] = self.segments
        if self.replay_run_id:
            body["replay_run_id"] = self.replay_run_id
        if self.signer:
            body["signer"] = {"keyid": self.signer}
        return body


Say = Callable[[str], None]


def json_run(ws: Workspace, replay_env: dict[str, str], args: list[str], out: Outcome) -> dict[str, Any]:
    """Run ``python -m marin.train.replay`` in the workspace. A commit older than that module can
    still have its checkpoints compared (restoring and digesting tensors is not the claim under
    test) with the verifier's own code; it cannot have segments replayed."""
    dest = ws.root.parent / f"replay-{secrets.token_hex(4)}.json"
    cwd, env = None, replay_env
    if not (ws.root / "marin" / "train" / "replay.py").is_file():
        if args[0] == "segments":
            raise CannotVerify(f"commit {ws.commit[:12]} predates segment replay (marin/train/replay.py); "
                               "verify this run with a full replay (without --segments)")
        cwd = Path(__file__).resolve().parents[2]  # the verifier's code first on the path
        env = {**replay_env, "PYTHONPATH": os.pathsep.join([str(cwd), replay_env["PYTHONPATH"]])}
        out.verifier["tensor_pass"] = f"verifier's code at {cwd} (the recorded commit predates it)"
    ws.run(["-m", "marin.train.replay", *args, "--out", str(dest)], env, f"replay {args[0]}", cwd)
    return readers.read_json(dest, "json", CannotVerify)


def counts(c: dict[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in sorted(c.items())) or "nothing"


def render(out: Outcome) -> list[str]:
    """The verdict in a few lines: class differences and distances, or the first divergence."""
    lines: list[str] = []
    if out.cpu:
        lines.append(f"  different CPU: {describe_cpu(out.cpu)}")
    if out.class_diffs:
        lines.append("  determinism class differs from the recorded one: "
                     + "; ".join(f"{d['key']}: {d['recorded']!r} -> {d['verifier']!r}" for d in out.class_diffs[:6]))
    if out.class_diffs and out.result != "bit-exact":
        for kind, table in (out.distances or {}).items():
            if isinstance(table, dict):
                for name, d in list(cast(dict[str, Any], table).items())[:12]:
                    lines.append(f"    distance {kind} {name}: max abs {d['max_abs']:.3g}, max rel {d['max_rel']:.3g}")
    elif out.divergences:
        lines.append(f"  first divergence: {out.first}")
        if len(out.divergences) > 1:
            lines.append(f"  ({len(out.divergences) - 1} more divergence(s) follow it)")
    if out.segments:
        s = out.segments
        lines.append(f"  segments: {s['k']} of {s['n']} intervals replayed; one forged interval among {s['n']} is "
                     f"drawn (and caught) with probability {s['k']}/{s['n']} = {s['detection_probability']:.0%}")
    verdict = {"bit-exact": "BIT-EXACT", "mismatch": "MISMATCH",
               "class-differs": "NOT BIT-EXACT: replayed in another determinism class (distances above)"}
    where = " on a different CPU" if out.cpu and out.result == "bit-exact" else ""
    lines.append(f"verify {out.run_id}: {verdict[out.result]}{where} (exit {out.exit_code}; verification record "
                 f"seq {out.record_seq})")
    return lines
