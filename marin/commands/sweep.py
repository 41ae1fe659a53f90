"""``marin sweep``: a set of hyperparameter trials recorded as one ledger run.

The trials come from ``params.yaml: sweep`` (a grid, or seeded random draws, over named params).
Each trial is a ``dvc exp run -S param=value ... TARGET`` in the workspace: its stage runs are
ordinary ledger runs, tagged with the sweep's run id and the trial's index
(``run.started.execution.sweep``; :func:`marin.ledger.run.sweep_tag`), and a DVC experiment.
The sweep run records the search space and seed (``run.started.params``), one ``trial`` record
per trial (its params, status, experiment, runs and last metrics; a failed or killed trial
stays, marked failed, with the last metrics its runs recorded) and a ``selection`` record (the
rule and the trial it names). The selected experiment is then applied to the workspace.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from marin.config import Params, SelectRule, SweepParams, flatten, parse, sweep_problem
from marin.env import git
from marin.errors import MarinError, ParamsError
from marin.ledger.bodies import SelectionBody, TrialBody, TrialRun
from marin.ledger.run import SWEEP_VAR, Plan, Recipe, Run
from marin.ledger.store import RunLog, load_run
from marin.params_file import present, read_yaml
from marin.paths import ledger_dir
from marin.stages import code_files

STAGE = "sweep"


class SweepError(MarinError):
    """params.yaml's sweep section cannot be run as asked."""

    exit_code = 2


def trials(spec: SweepParams, root_seed: int) -> list[dict[str, Any]]:
    """Each trial's params (dotted key -> value): every combination of the lists in order for a
    grid; ``spec.trials`` draws from ``random.Random(seed)`` for a random search. Their number is
    counted first, and refused above ``spec.max_trials``, before any is built."""
    if problem := sweep_problem(spec):
        raise SweepError(f"params.yaml: {problem}")
    if spec.method == "grid":
        for d in spec.space:
            if "values" not in d:
                raise SweepError(f"params.yaml: sweep.space {d['param']}: a grid needs `values`; low/high are "
                                 "for `method: random`")
        return [dict(zip([d["param"] for d in spec.space], combo, strict=True))
                for combo in itertools.product(*(d["values"] for d in spec.space))]
    rng = random.Random(root_seed if spec.seed is None else spec.seed)
    return [{d["param"]: _draw(rng, d) for d in spec.space} for _ in range(spec.trials)]


def _draw(rng: random.Random, d: dict[str, Any]) -> Any:
    if "values" in d:
        return rng.choice(d["values"])
    low, high = d["low"], d["high"]
    if d.get("log"):
        if low <= 0 or high <= 0:
            raise SweepError(f"params.yaml: sweep.space {d['param']}: log draws need low and high > 0")
        return math.exp(rng.uniform(math.log(low), math.log(high)))
    return rng.uniform(low, high)


def check_trials(raw: dict[str, Any], chosen: list[dict[str, Any]]) -> dict[str, Any]:
    """The baseline value of each swept param; a SweepError names a param params.yaml lacks or a
    trial whose params would not load (before any trial runs)."""
    flat = flatten(raw)
    baseline = {}
    for key in chosen[0] if chosen else []:
        if key not in flat:
            raise SweepError(f"params.yaml: sweep.space {key}: no such param (`marin params show` lists them)")
        baseline[key] = flat[key]
    for i, overrides in enumerate(chosen):
        try:
            parse(with_params(raw, overrides), f"sweep trial {i} ({_args(overrides)})")
        except ParamsError as e:
            raise SweepError(str(e)) from None
    return baseline


def with_params(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``raw`` params with each dotted key of ``overrides`` set (what `dvc exp run -S` will write)."""
    out = copy.deepcopy(raw)
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node[p]
        node[leaf] = value
    return out


def scalar(value: object) -> str:
    """A value as DVC's ``-S key=value`` reads it back (YAML): floats keep every digit and a dot."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = repr(value)
        return text.replace("e", ".0e") if "e" in text and "." not in text else text
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)


def set_args(given: object, overrides: dict[str, Any]) -> list[str]:
    """``dvc exp run``'s ``-S`` arguments for a trial: ``key=value`` where params.yaml (``given``, as
    written) has the key, ``++key=value`` (Hydra's add-or-set) where it leaves the key at its default."""
    sets = [f"{'' if present(given, k) == k else '++'}{k}={scalar(v)}" for k, v in overrides.items()]
    return [a for x in sets for a in ("-S", x)]


def _args(overrides: dict[str, Any]) -> str:
    return " ".join(f"{k}={scalar(v)}" for k, v in overrides.items())


def select(results: list[TrialBody], rule: SelectRule) -> SelectionBody:
    """The succeeded trial with the lowest (or highest) value of the rule's metric; the first on a tie."""
    done = [t for t in results if t["status"] == "succeeded" and rule.metric in t["metrics"]]
    words = f"{'lowest' if rule.goal == 'min' else 'highest'} {rule.metric}"
    body: SelectionBody = {"rule": {"metric": rule.metric, "goal": rule.goal}, "trial": None,
                           "reason": f"{words} of {len(done)} succeeded trial(s) of {len(results)}"}
    if done:
        sign = 1 if rule.goal == "min" else -1
        best = min(done, key=lambda t: (sign * t["metrics"][rule.metric], t["index"]))
        body.update(trial=best["index"], experiment=best["experiment"], value=best["metrics"][rule.metric])
    return body


def last_metrics(logs: list[RunLog]) -> dict[str, float]:
    """The last values the runs recorded: train's last metric record (step, loss, val_loss) and
    evaluate's bits per byte over the whole validation split."""
    out: dict[str, float] = {}
    for log in logs:
        metrics = log.bodies("metric")
        if metrics:
            last = metrics[-1]
            out["step"] = last["step"]
            out.update({k: v["value"] for k, v in last["values"].items() if k in ("loss", "val_loss")})
        for e in log.bodies("eval"):
            bpb = e["values"].get("bits_per_byte") if e["name"] == "model" and "corpus" not in e else None
            if isinstance(bpb, dict):  # an exact value (evaluate records no other kind of bits_per_byte)
                out["bits_per_byte"] = bpb["value"]
    return out


def _dvc() -> str:
    beside = Path(sys.executable).parent / "dvc"  # the environment marin runs in
    return str(beside) if beside.is_file() else (shutil.which("dvc") or "dvc")


def run_trial(root: Path, sweep_id: str, index: int, overrides: dict[str, Any], target: str,
              say: Callable[[str], None]) -> TrialBody:
    """One ``dvc exp run`` with the trial's params; its runs are found by their sweep tag."""
    name = f"sweep-{sweep_id.rsplit('-', 1)[-1]}-t{index}"
    before = {p.name for p in ledger_dir(root).glob("*.jsonl")}
    say(f"sweep: trial {index} ({_args(overrides)}): dvc exp run -n {name} {target}")
    cmd = [_dvc(), "exp", "run", "-n", name, *set_args(read_yaml(root / "params.yaml"), overrides), target]
    p = subprocess.run(cmd, cwd=root, env={**os.environ, SWEEP_VAR: f"{sweep_id}:{index}"}, capture_output=True,
                       text=True)
    logs = []
    for path in sorted(set(ledger_dir(root).glob("*.jsonl")) - {ledger_dir(root) / n for n in before}):
        log = load_run(root, path.stem, validate=False)
        tag = ((log.start_body.get("execution") or {}).get("sweep") if log.started else None) or {}
        if tag == {"run_id": sweep_id, "trial": index}:
            logs.append(log)
    logs.sort(key=lambda log: log.started.time)
    body: TrialBody = {
        "index": index, "params": overrides, "status": "succeeded" if p.returncode == 0 else "failed",
        "experiment": name,
        "runs": [TrialRun(run_id=log.run_id, stage=log.stage, status=log.status) for log in logs],
        "metrics": last_metrics(logs)}
    ref = next((line.split()[0] for line in (git(root, "for-each-ref", "--format=%(objectname) %(refname)",
                                                 "refs/exps/") or "").splitlines() if line.endswith(f"/{name}")), None)
    if ref and p.returncode == 0:
        body["commit"] = ref
    if p.returncode != 0:
        lines = [x.strip() for x in (p.stderr + p.stdout).splitlines() if x.strip()]
        errors = [x for x in lines if x.startswith(("marin: error", "ERROR"))]
        body["error"] = ((errors or lines or [f"dvc exp run exited {p.returncode}"])[-1])[:2000]
        say(f"sweep: trial {index} failed: {body['error']}")
    return body


def sweep(root: Path, params: Params, say: Callable[[str], None] = print) -> str:
    """Run every trial, record the sweep, apply the selected experiment; returns the sweep's run id."""
    if params.sweep is None:
        raise SweepError("params.yaml has no sweep section; add one (docs/guide/experiments.md, \"Sweeps\")")
    spec = params.sweep
    chosen = trials(spec, params.seed)
    baseline = check_trials(params.raw, chosen)
    recorded = {"sweep": params.raw["sweep"], "seed": params.seed, "baseline": baseline}
    plan = Plan.make(root, Recipe(STAGE, recorded, closure=code_files(root, STAGE)))  # its own index
    with Run.begin(plan) as run:
        say(f"sweep: run {run.run_id}, {len(chosen)} trial(s) ({spec.method}), up to stage {spec.target}")
        results = []
        for i, overrides in enumerate(chosen):
            results.append(run_trial(root, run.run_id, i, overrides, spec.target, say))
            run.record("trial", results[-1])
        chosen_body = select(results, spec.select)
        run.record("selection", chosen_body)
    failed = sum(t["status"] == "failed" for t in results)
    trial, experiment, value = chosen_body["trial"], chosen_body.get("experiment"), chosen_body.get("value")
    say(f"sweep: {len(results) - failed} succeeded, {failed} failed; selected: "
        + (f"trial {trial} ({chosen_body['reason']}: {value:.6g})" if trial is not None and value is not None
           else f"none ({chosen_body['reason']})"))
    if trial is not None and experiment is not None:
        p = subprocess.run([_dvc(), "exp", "apply", experiment], cwd=root, capture_output=True, text=True)
        say(f"sweep: dvc exp apply {experiment}" + ("" if p.returncode == 0 else
            f" (DVC: {([x for x in p.stderr.splitlines() if x.strip()] or ['?'])[-1].strip()})"))
    say("sweep: commit the ledger (git add ledger && git commit) to keep the record of every trial")
    return run.run_id
