"""The evaluate stage's lm-evaluation-harness tasks: each run through ``lm_eval.simple_evaluate``
on :class:`marin.evaluate.harness.MarinLM`, recorded as one ``eval`` record (name
``harness:<task>``, split ``harness``) whose values are, per metric, the value and its stderr
(exact floats), and the number of samples, the few-shot count and seed, the harness version, the
task config's digest and a digest over the per-sample log-likelihoods. The same requests under
the unigram baseline (:class:`marin.evaluate.harness.UnigramLM`) are recorded as ``unigram:<task>``.

There is no dataset hub here: a task whose data is not a local file fails in one line that names
it, is recorded with that line as its ``error``, and the other tasks go on.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from marin import hashing, readers
from marin.config import HarnessParams
from marin.errors import StageError
from marin.hub import hub_offline
from marin.ledger import Run, exact
from marin.stages import task_files

BUILTIN = Path(__file__).parent / "tasks"
SPLIT = "harness"
BOOTSTRAP_ITERS = 1000  # perplexity's stderr is a bootstrap (seeded, in this process)


def version() -> str:
    return metadata.version("lm-eval")


@contextlib.contextmanager
def offline(root: Path) -> Iterator[None]:
    """The harness's surroundings: no hub, a throwaway datasets cache, bootstraps in this process
    (a forked pool would copy the JAX runtime), data paths relative to the project root. datasets
    reads its settings when first imported: they are set on its config too, in case it was."""
    env = {"HF_DATASETS_OFFLINE": "1", "DISABLE_MULTIPROC": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    keep = {k: os.environ.get(k) for k in (*env, "HF_DATASETS_CACHE")}
    cwd = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="marin-harness-") as cache, hub_offline():
        os.environ.update(env, HF_DATASETS_CACHE=cache)
        import datasets.config as dc

        settings = {"HF_DATASETS_OFFLINE": True, "HF_HUB_OFFLINE": True, "HF_DATASETS_CACHE": Path(cache)}
        before = {k: getattr(dc, k) for k in settings if hasattr(dc, k)}
        for k in before:
            setattr(dc, k, settings[k])
        os.chdir(root)
        try:
            yield
        finally:
            os.chdir(cwd)
            for k, v in before.items():
                setattr(dc, k, v)
            for k, v in keep.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def task_names(root: Path, hp: HarnessParams) -> tuple[list[str], list[Path]]:
    """The task names to run, in order, and the folders to index: the built-in one, every
    ``include`` folder and every folder named in ``tasks`` (standing for all its tasks)."""
    folders = [BUILTIN, *(root / f for f in hp.include)]
    names: list[str] = []
    for t in hp.tasks:
        if (root / t).is_dir():
            folders.append(root / t)
            names += sorted(_task_of(p) for p in (root / t).rglob("*.yaml") if _task_of(p))
        else:
            names.append(t)
    return names, folders


def task_manager(root: Path, hp: HarnessParams, scratch: Path) -> tuple[list[str], Any, dict[str, str]]:
    """The task names, an lm-eval TaskManager over their folders, and why each registry task that
    cannot run cannot (one line). A registry task on a listed hub dataset gets a YAML in ``scratch``
    (:mod:`marin.evaluate.registry`), which must outlive the manager's loads."""
    from lm_eval.tasks import TaskManager

    names, folders = task_names(root, hp)
    tm = TaskManager(include_path=[str(f) for f in folders], include_defaults=False)
    unknown = [n for n in names if n not in tm.task_index]
    if not unknown:
        return names, tm, {}
    from marin.evaluate import registry

    errors = registry.write_overrides(root, hp, unknown, scratch)
    if any(scratch.glob("*.yaml")):
        tm = TaskManager(include_path=[*(str(f) for f in folders), str(scratch)], include_defaults=False)
    return names, tm, errors


def _task_of(path: Path) -> str:
    cfg = task_files.config_of(path)
    return cfg["task"] if isinstance(cfg.get("task"), str) else ""


def missing_data(root: Path, name: str, cfg: dict[str, Any]) -> str | None:
    """Why a task's data is not local (one line), or None."""
    path = cfg.get("dataset_path")
    if path in task_files.LOCAL_FORMATS:
        flat = task_files.data_files(cfg)
        if not flat:
            return f"harness task {name!r}: dataset_path {path} without dataset_kwargs.data_files; name local files"
        for f in flat:
            if problem := data_file_problem(root, f):
                return f"harness task {name!r}: data file {f} {problem}"
        return None
    if path and (Path(str(path)).is_absolute() or not (root / str(path)).resolve().is_relative_to(root.resolve())):
        return (f"harness task {name!r}: dataset {str(path)[:200]!r} lies outside the project; copy it into the "
                "project and name it relative to the project root")
    if path and not (root / str(path)).exists():
        return (f"harness task {name!r}: dataset {path!r} is not local (there is no hub here); use "
                "dataset_path: json with dataset_kwargs.data_files inside the project")
    return None


def data_file_problem(root: Path, f: str) -> str | None:
    """Why the task data file ``f`` is not one lm-eval may read (the rest of a line), or None: it must
    lie inside the project, named relative to it, and be a regular file within the ``task`` cap of
    :mod:`marin.readers` (lm-eval's datasets loader reads it whole, past every reader of ours)."""
    full = (root / f).resolve()
    if Path(f).is_absolute() or not full.is_relative_to(root.resolve()):
        return ("lies outside the project, or is named by an absolute path; copy it into the project and name "
                "it relative to the project root (the provenance covers project files only)")
    if not full.exists():
        return "is missing; run `dvc repro evalsets` for the built-in tasks, or fix dataset_kwargs.data_files"
    try:
        readers.open_file(full, "task", StageError).close()  # regular, and within the cap, before lm-eval reads it
    except StageError as e:
        why = str(e).split(": ", 1)[-1]  # without the path: the caller names it
        return why if why.startswith(("is ", "cannot ")) else f"is {why}"
    return None


def run_tasks(root: Path, hp: HarnessParams, lm: Any, record: Any, prefix: str = "harness", decon: Any = None,
              logs: dict[str, Any] | None = None, rounder: Any = None) -> dict[str, dict[str, Any]]:
    """Run every task on ``lm`` in one ``simple_evaluate``; ``record(body)`` takes each task's eval
    record body (``<prefix>:<task>``), in the order of ``tasks``. Returns the results by task
    (metric -> value, or ``error`` for a task that could not run); ``logs`` takes, by task that ran,
    lm-eval's own results, config and per-sample log (:func:`results_json`, :func:`samples_jsonl`);
    ``rounder``: universal's, which rounds lm-eval's aggregates (marin.evaluate.universal_scoring)."""
    errors = []
    # the harness's progress bars and notes, and datasets', are not the stage's output
    with offline(root), contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()), \
            tempfile.TemporaryDirectory(prefix="marin-tasks-") as scratch:
        names, tm, refused = task_manager(root, hp, Path(scratch))
        loaded, bodies = {}, {}
        for name in names:
            task, error = (None, refused[name]) if name in refused else load_task(root, tm, name)
            if error is None and decon is not None and decon.mode == "exclude":  # marin.evaluate.decontam
                error = decon.problem(name, task) or (None if decon.clean_ids(name, hp.limit) else
                                                      f"harness task {name!r}: every item it would score is "
                                                      "contaminated (evaluate.decontaminate: exclude)")
            if error is not None:
                errors.append(error)
                bodies[name] = {"name": f"{prefix}:{name}", "split": SPLIT, "values": {"error": error}}
            else:
                loaded[name] = task
        logs = {} if logs is None else logs
        if not _runs(lm, hp, loaded, tm, bodies, prefix, logs, decon, rounder):  # a task raised: one by one, to name it
            for name in loaded:
                try:
                    _runs(lm, hp, {name: load_task(root, tm, name)[0]}, tm, bodies, prefix, logs, decon, rounder)
                except Exception as e:
                    errors.append(f"harness task {name!r} failed: {type(e).__name__}: {_line(e)}")
                    bodies[name] = {"name": f"{prefix}:{name}", "split": SPLIT, "values": {"error": errors[-1]}}
    for error in errors:
        print(f"marin: error: {error}", file=sys.stderr)
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        record(bodies[name])
        out[name] = {k: v["value"] if isinstance(v, dict) else v for k, v in bodies[name]["values"].items()}
    return out


def _runs(lm: Any, hp: HarnessParams, loaded: dict[str, Any], tm: Any, bodies: dict[str, Any], prefix: str,
          logs: dict[str, Any], decon: Any = None, rounder: Any = None) -> bool:
    """Run ``loaded`` tasks in one ``simple_evaluate`` and put their bodies in ``bodies``; False if
    more than one task ran and one of them raised (the caller reruns them one by one)."""
    from lm_eval import simple_evaluate as evaluate_fn

    simple_evaluate: Any = evaluate_fn  # lm-eval's decorated signature confuses type checkers

    if not loaded:
        return True
    only = {n: decon.clean_ids(n, hp.limit) for n in loaded} if decon and decon.mode == "exclude" else None
    try:
        with no_env_probe():
            res = simple_evaluate(
                model=lm, tasks=list(loaded.values()), task_manager=tm, num_fewshot=hp.num_fewshot,
                limit=hp.limit if only is None else None, samples=only,
                random_seed=hp.seed, numpy_random_seed=hp.seed, torch_random_seed=None, fewshot_random_seed=hp.seed,
                bootstrap_iters=BOOTSTRAP_ITERS, log_samples=True)
    except Exception:
        if len(loaded) == 1:
            raise
        return False
    for name in loaded:
        if rounder is not None:  # its aggregates through exp and log: float32 with the log, in the files too
            res["results"][name] = rounder.values(f"{prefix}:{name}", res["results"][name])
        extra = decon.values(name, loaded[name], res, hp.limit) if decon is not None else {}
        bodies[name] = {"name": f"{prefix}:{name}", "split": SPLIT, "values": {**values(res, name, hp), **extra}}
        logs[name] = {k: res[k][name] for k in ("results", "configs", "versions", "n-shot", "higher_is_better",
                                                "n-samples", "samples") if name in res.get(k, {})}
    return True


@contextlib.contextmanager
def no_env_probe() -> Iterator[None]:
    """``simple_evaluate`` without its closing ``add_env_info``: with torch installed (the ``hf`` group) that
    imports torch and runs ``pip list`` through ``torch.utils.collect_env``, 4 s warm and 9 s cold on 2 cores
    (about 10x that under qemu), for keys of the results that marin never reads (``pretty_env_info`` ...):
    the run's environment is in its run.started record."""
    import lm_eval.evaluator as ev

    saved = ev.add_env_info
    ev.add_env_info = lambda storage: None  # pyright: ignore[reportAttributeAccessIssue]
    try:
        yield
    finally:
        ev.add_env_info = saved


def _line(e: BaseException) -> str:
    return (str(e).splitlines() or [""])[0][:300]


def load_task(root: Path, tm: Any, name: str) -> tuple[Any, str | None]:
    """The task ``name`` (an lm-eval Task), or why it cannot run (one line)."""
    entry = tm.task_index.get(name)
    if entry is None:
        return None, (f"harness task {name!r} is not a built-in task, nor in evaluate.harness.include, nor an "
                      "lm-eval registry task; name a task of a folder listed there")
    error = missing_data(root, name, entry.cfg or {})
    if error is not None:
        return None, error
    try:
        (task,) = tm.load_task_or_group([name]).values()
    except Exception as e:  # a lab's YAML or its data files: report, go on with the other tasks
        return None, f"harness task {name!r} cannot be loaded: {type(e).__name__}: {_line(e)}"
    return task, None


def values(res: dict[str, Any], name: str, hp: HarnessParams) -> dict[str, Any]:
    """The recorded values of one task's results: exact metric values and stderrs, then the facts
    that make them comparable (samples, shots, seed, versions, digests)."""
    out: dict[str, Any] = {}
    for key, v in sorted(res["results"][name].items()):
        if "," not in key:
            continue  # alias, name
        metric, filt = key.split(",", 1)
        label = metric if filt == "none" else f"{metric}/{filt}"
        out[label] = exact(v) if isinstance(v, int | float) else str(v)
    config = json.loads(json.dumps(res["configs"][name], sort_keys=True, default=str))
    out.update(baseline_values(config, res, name))
    out.update(hub_source(config, hp))
    meta = config.get("metadata") or {}
    if "config_source" in meta:  # where the YAML lies: project-relative, so a replay elsewhere agrees
        src = Path(meta["config_source"])
        meta["config_source"] = src.relative_to(Path.cwd()).as_posix() if src.is_relative_to(Path.cwd()) else src.name
    n = res["n-samples"][name]
    limit = {"limit": hp.limit} if hp.limit is not None else {}
    return {**out, "samples": int(n["effective"]), "items": int(n["original"]), **limit,
            "num_fewshot": int(res["n-shot"][name]),
            "fewshot_seed": hp.seed, "harness_version": version(), "task_config_digest": hashing.json_digest(config),
            "loglikelihoods_digest": samples_digest(res["samples"][name])}


def hub_source(config: dict[str, Any], hp: HarnessParams) -> dict[str, str]:
    """A registry task's Hub dataset (the ``evaluate.harness.datasets`` entry whose folder holds its data files,
    :mod:`marin.evaluate.registry`) and the split it scored, as lm-eval picks it (the test split where the task
    has one, else validation): what a card's ``model-index`` names. Nothing for a task on other files."""
    files = {Path(f) for f in task_files.data_files(config)}
    hub = next((d.hub_id for d in hp.datasets if files and all(f.is_relative_to(Path(d.path)) for f in files)), None)
    split = config.get("test_split") or config.get("validation_split")
    return {"dataset": hub, "dataset_split": str(split)} if hub and split else {}


def baseline_values(config: dict[str, Any], res: dict[str, Any], name: str) -> dict[str, Any]:
    """Per metric of a task: its chance level (stated, else computed: :mod:`marin.evaluate.baselines`),
    the best constant answer's score, which way is better, and how its stderr was computed."""
    from marin.evaluate import baselines as bl

    out: dict[str, Any] = {}
    samples, kind = res["samples"].get(name, []), str(config.get("output_type", ""))
    stated = (config.get("metadata") or {}).get("chance") or {}
    aggregation = bl.stated_aggregations(config)
    for metric, better in sorted((res.get("higher_is_better", {}).get(name) or {}).items()):
        if f"{metric},none" not in res["results"][name]:
            continue
        chance = stated.get(metric, bl.computed_chance(kind, samples) if metric in bl.CONSTANT else None)
        if chance is not None:
            out[f"chance/{metric}"] = exact(chance)  # the task's own statement (metadata.chance), else computed
        constant = bl.constant_answer(kind, samples) if metric in bl.CONSTANT else None
        if constant is not None:
            out[f"constant/{metric}"] = exact(constant)
        out[f"better/{metric}"] = "higher" if better else "lower"
        if isinstance(res["results"][name].get(f"{metric}_stderr,none"), int | float):
            out[f"stderr_method/{metric}"] = bl.stderr_method(aggregation.get(metric, "?"), BOOTSTRAP_ITERS)
    return out


def terminal_line(name: str, vals: dict[str, Any], unigram: dict[str, Any], output_type: str = "") -> str:
    """One task's results for the terminal: each metric with its stderr, baselines (``n/a`` and why,
    where one has no meaning) and mark, the samples scored out of the task's items (and the limit,
    where set), the shots."""
    from marin.evaluate import baselines as bl

    parts = []
    for m in sorted(k for k, v in vals.items() if isinstance(v, float) and "/" not in k and "stderr" not in k):
        se = vals.get(f"{m}_stderr")
        known = {"chance": vals.get(f"chance/{m}"), "unigram": unigram.get(m), "constant answer": vals.get(
            f"constant/{m}")}
        known = {k: v for k, v in known.items() if isinstance(v, int | float)}
        where = bl.mark(vals[m], se if isinstance(se, float) else None, vals.get(f"better/{m}", "higher"),
                        list(known.values()))  # as the report and the card mark it: every baseline recorded
        shown = bl.shown(m, known, output_type)
        parts.append(f"{m} {vals[m]:.4f}" + (f" ± {se:.4f}" if isinstance(se, float) else "")
                     + (" (" + ", ".join(shown) + ")" if shown else "")
                     + (f": {where}" if where and where != bl.BETTER else ""))
    limit = f", limit {vals['limit']}" if "limit" in vals else ""
    return (f"evaluate: harness {name}: {'; '.join(parts)} ({vals['samples']} of {vals['items']} samples{limit}, "
            f"{vals['num_fewshot']}-shot)")


def per_sample(samples: list[dict[str, Any]]) -> list[list[Any]]:
    """[doc id, [each response: float.hex() of a log-likelihood, the greedy flag, or the text]]."""
    def one(r: Any) -> Any:
        r = r[0] if isinstance(r, list) and len(r) == 1 else r
        if isinstance(r, list | tuple):
            return [one(x) for x in r]
        return float(r).hex() if isinstance(r, float) else r

    return [[s["doc_id"], [one(r) for r in s["resps"]]] for s in sorted(samples, key=lambda s: s["doc_id"])]


def samples_digest(samples: list[dict[str, Any]]) -> str:
    return hashing.json_digest(per_sample(samples))


# ``model`` is marin.model.weights.Loaded, spelled out: a type-only import still counts in the import closures
# (marin/stages/closure.py), and decontaminate, which imports this module, would depend on the model code
def evaluate(root: Path, hp: HarnessParams, run: Run, model: tuple[Any, Any, dict[str, Any]],
             tok_manifest: dict[str, Any], tokens: Path, logs: dict[str, Any],
             decon: Any = None, rounder: Any = None) -> dict[str, dict[str, Any]]:
    """The evaluate stage's harness part: ``hp``'s tasks on the stage's model, one eval record each
    in ``run`` (``harness:<task>``), then the tasks that ran under the unigram baseline of the train
    tokens (``unigram:<task>``); the model's numeric results by task, for metrics/eval.json. ``logs``
    takes lm-eval's results and per-sample log of the model's tasks (the stage writes them out); ``rounder``:
    the universal profile's (marin.evaluate.universal_scoring)."""
    from dataclasses import replace

    from marin.data import tokenize as tk
    from marin.data.documents import shard_tokens
    from marin.evaluate import scoring
    from marin.evaluate.harness import MarinLM, UnigramLM

    graphdef, params, config = model
    eos, seq_len, tokenizer = tok_manifest["tokenizer"]["eos_id"], config["model"]["max_seq_len"], tk.load(
        tokens / "tokenizer.json")
    lm = MarinLM(graphdef, params, tokenizer, eos, seq_len, batch_size=hp.batch_size, rounder=rounder)
    results = run_tasks(root, hp, lm, lambda body: run.record("eval", body), decon=decon, logs=logs, rounder=rounder)
    base: dict[str, dict[str, Any]] = {}
    ran = tuple(name for name, vals in results.items() if "error" not in vals)
    if ran:  # the same requests, same seed, under the unigram model: the baseline where a task has one
        counts = scoring.token_counts(shard_tokens(tokens / s["file"] for s in tok_manifest["splits"]["train"]
                                                   ["shards"]), config["model"]["vocab_size"])
        folders = tuple(t for t in hp.tasks if (root / t).is_dir())
        base = run_tasks(root, replace(hp, tasks=ran, include=(*hp.include, *folders)),
                         UnigramLM(counts, tokenizer, eos, seq_len, logp=None if rounder is None else rounder.table(
                             "unigram.logp", scoring.unigram_logp(counts))), lambda body: run.record("eval", body),
                         prefix="unigram", decon=decon, rounder=rounder)
    for name in ran:
        print(terminal_line(name, results[name], base.get(name, {}),
                            str(logs.get(name, {}).get("configs", {}).get("output_type", ""))))
    return {name: {**{k: v for k, v in results[name].items() if isinstance(v, int | float)
                      or k.startswith("better/") or k in ("dataset", "dataset_split")},
                   **{f"unigram/{k}": v for k, v in base.get(name, {}).items()
                      if isinstance(v, float) and "/" not in k and "stderr" not in k}} for name in ran}
