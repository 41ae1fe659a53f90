"""marin.verify.compare on its own: a recorded run and a replay built from schema-valid records
(Record.create validates each body), compared record by record."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from marin.ledger.records import Record, exact
from marin.ledger.store import RunLog
from marin.verify.compare import class_differences, compare, key_of, metric_distances, value_of
from tests.test_records import EXAMPLES

RUN = "train-20260101T000000Z-0123abcd"


def log(*records: tuple[str, dict[str, Any]], run_id: str = RUN) -> RunLog:
    """A run file's records, chained as the ledger chains them."""
    out: list[Record] = []
    for seq, (kind, body) in enumerate(records):
        out.append(Record.create(run_id, seq, out[-1].digest if out else None, kind, body,
                                 time=f"2026-01-01T00:00:{seq:02d}.000000Z"))
    return RunLog(Path(f"{run_id}.jsonl"), out)


def metric(step: int, loss: float, tokens_per_s: float = 1.0) -> tuple[str, dict[str, Any]]:
    return "metric", {"step": step, "values": {"loss": exact(loss)}, "timing": {"tokens_per_s": tokens_per_s}}


def body(kind: str, **changes: Any) -> tuple[str, dict[str, Any]]:
    return kind, {**copy.deepcopy(EXAMPLES[kind]), **changes}


FINISHED = body("run.finished")
TRAIN = [body("run.started"), body("input"), metric(10, 3.0), metric(20, 2.5), body("checkpoint"),
         body("eval"), body("output"), FINISHED]


def test_a_faithful_replay_has_no_divergence_and_counts_each_kind() -> None:
    counts, divergences = compare(log(*TRAIN), log(*TRAIN))
    assert divergences == []
    assert counts == {"input": 1, "metric": 2, "checkpoint": 1, "eval": 1, "output": 1}


def test_timings_the_checkpoint_folder_and_where_it_was_stored_never_compare() -> None:
    stored = {"remote": "lab", "url": "s3://lab/dvc/marin/sha256/ab/" + "c" * 62, "manifest": "sha256:" + "ab" * 32}
    recorded = [body("checkpoint", stored=stored) if k == "checkpoint" else (k, b) for k, b in TRAIN]
    replay = [metric(10, 3.0, 99.0) if k == "metric" and b["step"] == 10 else (k, b) for k, b in TRAIN]
    replay = [body("checkpoint", path="checkpoints/train-other/50") if k == "checkpoint" else (k, b)
              for k, b in replay]
    assert compare(log(*recorded), log(*replay)) == ({"input": 1, "metric": 2, "checkpoint": 1, "eval": 1,
                                                       "output": 1}, [])


def test_one_bit_of_a_metric_is_a_divergence_at_its_step_and_name() -> None:
    off = 2.5 + 2**-51  # the next float but one: another hex
    replay = [metric(20, off) if k == "metric" and b["step"] == 20 else (k, b) for k, b in TRAIN]
    _, [d] = compare(log(*TRAIN), log(*replay))
    assert (d.seq, d.kind, d.step, d.name) == (3, "metric", 20, "loss")
    assert d.recorded == {"loss": exact(2.5)} and d.replayed == {"loss": exact(off)}
    assert d.what == f"loss recorded 2.5 ({(2.5).hex()}) replayed {off!r} ({off.hex()})"
    assert d.independent is None  # a class difference may explain it: verify decides


def test_a_changed_output_names_each_differing_field() -> None:
    other = "sha256:" + "cd" * 32
    replay = [body("output", digest=other, size=6) if k == "output" else (k, b) for k, b in TRAIN]
    _, [d] = compare(log(*TRAIN), log(*replay))
    assert (d.seq, d.kind, d.name) == (6, "output", "train")
    assert d.recorded == {"digest": EXAMPLES["output"]["digest"], "size": 5}
    assert d.replayed == {"digest": other, "size": 6}
    assert d.what.startswith(f"digest recorded '{EXAMPLES['output']['digest']}', replayed '{other}'; size recorded 5")


def test_missing_extra_and_duplicate_records_are_each_named() -> None:
    recorded = [*TRAIN[:3], metric(10, 3.0), *TRAIN[3:]]  # step 10 recorded twice
    replay = [x for x in TRAIN if x[0] != "eval"]
    replay.insert(4, metric(30, 2.0))
    _, divergences = compare(log(*recorded), log(*replay))
    got = {d.what: (d.seq, d.kind) for d in divergences}
    assert got == {"a second metric record for (10,) (first at seq 2)": (3, "metric"),
                   "recorded, but the replay did not produce it": (6, "eval"),
                   "the replay produced metric (30,), which the run does not record (a record was removed)":
                       (len(recorded) - 1, "metric")}  # at the recorded run.finished
    assert all(d.independent for d in divergences)
    assert [d.seq for d in divergences] == sorted(d.seq for d in divergences)


def test_a_decimal_that_is_not_its_hex_is_named() -> None:
    edited = ("metric", {"step": 10, "values": {"loss": {"value": 3.5, "hex": (3.0).hex()}}})
    recorded = [x if not (x[0] == "metric" and x[1]["step"] == 10) else edited for x in TRAIN]
    _, [d] = compare(log(*recorded), log(*recorded))
    assert d.what == f"/values/loss: decimal 3.5 is not hex {(3.0).hex()}" and d.name == "loss" and d.independent


def test_keys_and_compared_values() -> None:
    recs = log(*TRAIN).records
    assert [key_of(r) for r in recs] == [None, ("input", "archive:x"), ("metric", 10), ("metric", 20),
                                         ("checkpoint", 50), ("eval", "model", "validation", "bible"),
                                         ("output", "train"), None]
    assert "timing" not in value_of(recs[2]) and "path" not in value_of(recs[4]) and "path" in value_of(recs[1])


def test_class_differences_list_every_flattened_key_that_differs() -> None:
    got = class_differences({"kind": "jax", "xla": {"threads": 4, "isa": "avx2"}},
                            {"kind": "jax", "xla": {"threads": 8}, "devices": 2})
    assert got == [{"key": "devices", "recorded": None, "verifier": 2},
                   {"key": "xla.isa", "recorded": "avx2", "verifier": None},
                   {"key": "xla.threads", "recorded": 4, "verifier": 8}]


def test_metric_distances_keep_the_largest_difference_and_its_step() -> None:
    replay = [metric(10, 3.0 + 1e-3), metric(20, 2.5 - 1e-2)]
    replay = [x for x in TRAIN if x[0] != "metric"][:2] + replay + [x for x in TRAIN if x[0] != "metric"][2:]
    got = metric_distances(log(*TRAIN), log(*replay))
    assert set(got) == {"loss", "model/validation/bible/bits_per_byte"}
    loss = got["loss"]
    assert loss["compared"] == 2 and loss["at"] == 20
    assert loss["max_abs"] == abs(2.5 - (2.5 - 1e-2)) and loss["max_rel"] == abs(2.5 - (2.5 - 1e-2)) / 2.5
    assert got["model/validation/bible/bits_per_byte"] == {"max_abs": 0.0, "max_rel": 0.0, "compared": 1}
