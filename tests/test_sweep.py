"""The pure pieces of `marin sweep`: trials from the search space, values as DVC reads them back,
the selection rule. The sweep end to end (real DVC, a killed trial, MLflow) is in test_experiments.py."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import yaml

from marin.commands.sweep import SweepError, check_trials, scalar, select, set_args, trials
from marin.config import SelectRule, SweepParams, load
from tests.conftest import REPO


def spec(method: str, *space: dict, **kw) -> SweepParams:
    return SweepParams(method=method, space=space, select=SelectRule("bits_per_byte", "min"), **kw)


def test_a_grid_is_every_combination_in_the_order_written() -> None:
    got = trials(spec("grid", {"param": "train.lr", "values": [1, 2]}, {"param": "seed", "values": ["a", "b", "c"]}),
                 0)
    assert got == [{"train.lr": a, "seed": b} for a in (1, 2) for b in ("a", "b", "c")]


def test_random_draws_repeat_with_their_seed_and_stay_in_range() -> None:
    s = spec("random", {"param": "train.lr", "low": 1e-4, "high": 1e-2, "log": True},
             {"param": "train.steps", "values": [10, 20]}, trials=50, seed=7)
    first = trials(s, 0)
    assert first == trials(s, 123) and len(first) == 50  # the sweep's seed, not the root seed
    assert first != trials(spec("random", *s.space, trials=50, seed=8), 0)
    assert all(1e-4 <= t["train.lr"] <= 1e-2 and t["train.steps"] in (10, 20) for t in first)
    logs = [math.log10(t["train.lr"]) for t in first]  # log-uniform: both decades are drawn from
    assert any(x < -3 for x in logs) and any(x > -3 for x in logs)
    rng = random.Random(7)  # the documented draw, computed here
    assert first[0]["train.lr"] == math.exp(rng.uniform(math.log(1e-4), math.log(1e-2)))
    assert trials(spec("random", {"param": "train.lr", "values": [1, 2]}, trials=3), 11) == \
        trials(spec("random", {"param": "train.lr", "values": [1, 2]}, trials=3, seed=11), 0)


def test_a_grid_of_a_range_is_refused() -> None:
    with pytest.raises(SweepError, match=r"sweep\.space train\.lr: a grid needs `values`"):
        trials(spec("grid", {"param": "train.lr", "low": 0.1, "high": 0.2}), 0)


@pytest.mark.parametrize("value", [1e-05, 0.001, 3.0e-3, 1e300, 5, True, "cosine", 2.5e-07])
def test_values_are_written_as_yaml_reads_them_back(value) -> None:
    assert yaml.safe_load(scalar(value)) == value and type(yaml.safe_load(scalar(value))) is type(value)


def test_a_trial_sets_a_key_params_yaml_has_and_adds_one_it_leaves_at_its_default(tmp_path: Path) -> None:
    from dvc.utils.hydra import apply_overrides

    given = {"train": {"lr": 0.003}, "runtime": {}}
    args = set_args(given, {"train.lr": 0.01, "train.beta2": 0.98, "runtime.devices": 2})
    assert args == ["-S", "train.lr=0.01", "-S", "++train.beta2=0.98", "-S", "++runtime.devices=2"]
    with pytest.raises(Exception, match="set-param"):  # what DVC (Hydra) says to a plain key the file lacks
        apply_overrides(str(_written(given, tmp_path / "a")), ["train.beta2=0.98"])
    path = _written(given, tmp_path / "b")
    apply_overrides(str(path), args[1::2])  # what `dvc exp run -S ...` writes: every override lands
    assert yaml.safe_load(path.read_text()) == {"train": {"lr": 0.01, "beta2": 0.98}, "runtime": {"devices": 2}}


def _written(doc: dict, folder: Path) -> Path:
    folder.mkdir()
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_param_params_yaml_lacks_or_a_trial_that_would_not_load_is_refused_first() -> None:
    raw = load(REPO / "params.yaml").raw
    assert check_trials(raw, [{"train.lr": 0.01}]) == {"train.lr": raw["train"]["lr"]}
    with pytest.raises(SweepError, match=r"sweep\.space train\.learning_rate: no such param"):
        check_trials(raw, [{"train.learning_rate": 0.01}])
    with pytest.raises(SweepError, match=r"sweep trial 1 \(train.lr=2.0\).*train.lr"):
        check_trials(raw, [{"train.lr": 0.01}, {"train.lr": 2.0}])


def test_selection_takes_the_best_succeeded_trial_and_says_by_what_rule() -> None:
    def t(i, status, **m):
        return {"index": i, "status": status, "experiment": f"e{i}", "params": {}, "runs": [], "metrics": m}

    results = [t(0, "succeeded", bits_per_byte=2.5), t(1, "failed", bits_per_byte=1.0), t(2, "succeeded", loss=1.0),
               t(3, "succeeded", bits_per_byte=2.0), t(4, "succeeded", bits_per_byte=2.0)]
    body = select(results, SelectRule("bits_per_byte", "min"))
    assert (body["trial"], body["value"], body["experiment"]) == (3, 2.0, "e3")  # failed ones never; ties: first
    assert body["reason"] == "lowest bits_per_byte of 3 succeeded trial(s) of 5"
    assert select(results, SelectRule("bits_per_byte", "max"))["trial"] == 0
    assert select([t(0, "failed")], SelectRule("loss", "min"))["trial"] is None


def test_the_training_budget_in_epochs_and_tokens_per_parameter() -> None:
    from marin.train.budget import Budget

    b = Budget(tokens_seen=400 * 32 * 128, unique_tokens=18_170, n_params=1_000_000)  # a 132 KB BYOD corpus
    assert b.epochs == pytest.approx(90.18, abs=0.01) and b.tokens_per_param == pytest.approx(1.6384)
    assert b.line() == "train: 1,638,400 tokens seen = 90.2 epochs of 18,170 unique training tokens, " \
                       "1.64 tokens per parameter (Chinchilla compute-optimal: ~20, Hoffmann et al. 2022)"
    assert b.warning(4).startswith("marin: warning: train: 90.2 epochs (1,638,400 tokens seen, 18,170 unique) is "
                                   "past train.max_epochs_warning (4): ") and "\n" not in b.warning(4)
    assert b.warning(90.5) is None and Budget(100, 200, 10).warning(4) is None
