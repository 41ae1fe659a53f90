"""The universal profile's rounding log as a file, without JAX: its format, reading it, where a recorded
run keeps it, and the environment variables that choose the threshold and the log a replay follows
(the log's use is :mod:`marin.train.universal`).

One JSON object a line: a header ``{"format": "marin.rounding-log@1"}``, then one entry per logged value,
``{"step": S, "tensor": T, "index": I, "direction": D}`` (S: the steps done when the value was rounded,
as checkpoints count; T: the state leaf's pytree path, ``grad`` and the parameter's path, ``scalar.clip``,
``scalar.lr`` or ``metric.<name>``; I: the flat index; D: 1 the
magnitude rounded away from zero, 0 towards), in step order and, within a step, tensor and index order.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from marin import readers
from marin.errors import MarinError

# In float32 ulps of a value's scale (marin.train.rounding.scaled_distance). Measured (docs/determinism.md):
# x86-64 and aarch64 (qemu) differed by at most 2^-25.7 over 6 universal steps of the tests' tiny model, so
# an honest pair stays ~100x inside tau/2 (a replay's windows: marin.train.universal).
TAU = 2.0**-18
FORMAT = "marin.rounding-log@1"
LOG_FILE = "rounding.jsonl"  # beside a run's checkpoints (checkpoints/<run>/) and in its model folder
TAU_VAR = "MARIN_ROUNDING_TAU"  # a threshold other than TAU at record time (tests, measurements): in the class
REPLAY_VAR = "MARIN_ROUNDING_LOG"  # a recorded rounding log: the run takes its directions from it (a replay)
GRAD = "grad"  # the gradient's tensors: grad['blocks'][0]..., rounded before the optimizer uses them
SCORING_DIR = Path("evals/rounding")  # a scoring stage's log, <stage>.jsonl (marin.evaluate.universal_scoring)
OUTPUT = "rounding_log"  # a scoring stage's output record of its log
AGAINST = ".against.jsonl"  # beside a replayed scoring log: the logged directions against the replay's nearest even

Log = dict[int, dict[str, dict[int, int]]]  # step -> tensor -> flat index -> direction


class RoundingError(MarinError):
    """A replay met a value the recorded rounding log does not account for, or a log that is not one."""


def tau() -> float:
    """The threshold of this run: TAU, or ``MARIN_ROUNDING_TAU`` (a float, 0 <= tau < 1/2)."""
    raw = os.environ.get(TAU_VAR)
    if raw is None:
        return TAU
    try:
        t = float(raw)
    except ValueError:
        t = -1.0
    if not 0.0 <= t < 0.5:
        raise RoundingError(f"{TAU_VAR}={raw!r}: a threshold in float32 ulps, at least 0 and below 1/2")
    return t


def header() -> bytes:
    return (json.dumps({"format": FORMAT}) + "\n").encode()


def entry(step: int, tensor: str, index: int, direction: int) -> bytes:
    return (json.dumps({"step": step, "tensor": tensor, "index": index, "direction": direction}) + "\n").encode()


def entries(path: Path, partial: bool = False) -> Iterator[tuple[int, str, int, int]]:
    """(step, tensor, index, direction) of every entry of a rounding log, in its order; a line that is
    not one is a RoundingError naming it, or (``partial``: a killed run's log, whose last line may be
    cut short) the end of the log."""
    for n, line in enumerate(readers.lines(path, "rounding_log", RoundingError), 1):
        try:
            e = json.loads(line)
            if n == 1:
                if e.get("format") != FORMAT:
                    raise ValueError(f"not a {FORMAT} header")
                continue
            step, tensor, index, direction = e["step"], e["tensor"], e["index"], e["direction"]
            if not (isinstance(step, int) and isinstance(tensor, str) and isinstance(index, int) and index >= 0
                    and direction in (0, 1)):
                raise ValueError("an entry is {step, tensor, index >= 0, direction 0 or 1}")
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            if partial and n > 1:
                return
            raise RoundingError(f"{path} line {n}: not a rounding log entry ({err})") from None
        yield step, tensor, index, direction


def read(path: Path) -> Log:
    """A recorded rounding log: {step: {tensor: {flat index: direction}}}."""
    out: Log = {}
    for step, tensor, index, direction in entries(path):
        out.setdefault(step, {}).setdefault(tensor, {})[index] = direction
    return out
