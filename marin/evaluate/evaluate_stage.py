"""Stage evaluate: bits per byte and perplexity of the trained model on the validation
split (whole and per corpus) beside a unigram baseline on the same tokens, and greedy
samples from fixed prompts. Writes metrics/eval.json (DVC metrics: the measurements), evals/eval_context.json
(their baselines, counts and settings) and eval records.

Everything that may start jax or allocate (jax, flax, numpy, pyarrow) is imported inside
the functions, after :func:`marin.train.runtime.configure` has set the environment XLA and
malloc read."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from marin import fsutil, stages
from marin.config import HarnessParams, Params, RuntimeParams
from marin.evaluate import decontam, metrics_file
from marin.train import runtime

if TYPE_CHECKING:
    from marin.evaluate.universal_scoring import Rounder
    from marin.ledger import Run
    from marin.model.weights import Loaded

_DECLARED = stages.declaration("evaluate")  # the paths below: marin/stages/table.py
MODEL, TOKENS, METRICS = _DECLARED.input("model"), _DECLARED.input("tokens"), _DECLARED.out("eval_metrics")
CONTEXT = _DECLARED.out("eval_context")  # the metrics' baselines, counts and settings (marin.evaluate.metrics_file)
EVALSETS = _DECLARED.input("evalsets")  # the built-in harness tasks' data (stage evalsets)
TRACE = _DECLARED.out("trace_samples")  # the greedy samples traced to the training documents (marin trace)


def run_stage(root: Path, params: Params) -> None:
    """The evaluate stage: models/final scored on data/tokens, recorded as a ledger run."""
    rt = RuntimeParams(params.runtime.xla_cpu_threads, 1, "replicated",  # scoring needs no mesh
                       determinism=params.runtime.determinism)
    runtime.configure(rt)
    import jax  # noqa: F401  # before the fingerprint: importing jax sets TF_CPP_MIN_LOG_LEVEL, which it records

    from marin import env
    from marin.data import manifest
    from marin.evaluate import harness_run, tracing, universal_scoring
    from marin.ledger import Input, Recipe, Run
    from marin.model import weights

    fp = env.fingerprint()
    inputs = [Input("model", MODEL.as_posix()), Input("tokens", TOKENS.as_posix())]
    if (root / EVALSETS).is_dir():  # else the built-in harness tasks fail, each in one line
        inputs.append(Input("evalsets", EVALSETS.as_posix()))
    inputs += [Input(f"task:{p}", p) for p in _task_deps(root, params.evaluate.harness)]
    decon = decontam.load(root, params.evaluate.decontaminate)  # None: not run, and not asked to exclude
    if decon is not None:
        inputs.append(Input("decontamination", decontam.OUT.as_posix()))
    if tracing.indexed(root):  # else the trace file says the samples were not traced
        inputs.append(Input("trace_index", tracing.INDEX.as_posix()))
    recorded = {"evaluate": {k: v for k, v in params.raw["evaluate"].items() if k != "references"},  # their own stages
                "runtime": {"xla_cpu_threads": rt.xla_cpu_threads, "determinism": params.runtime.determinism},
                "trace": {"min_tokens": params.trace.min_tokens}}
    with Run.start(root, Recipe("evaluate", recorded, inputs, closure=stages.code_files(root, "evaluate"),
                                 det_class=runtime.determinism_class(rt, fp), fingerprint=fp)) as run, \
            universal_scoring.stage_log(root, run, "evaluate", rt.determinism) as rounder:
        model = weights.load(root / MODEL)
        model = model if rounder is None else universal_scoring.wide_model(model)  # universal: float64
        tok_manifest = manifest.read(root / TOKENS / "manifest.json", "tokenize")
        results = _score(root, params, run, model, tok_manifest, rounder)
        samples = _samples(root, params, run, model, tok_manifest, rounder)
        tracing.record_samples(root, run, {"greedy_samples": samples}, TRACE, params.trace.min_tokens)
        metrics = _metrics(results)
        logs: dict[str, Any] = {}
        metrics["harness"] = harness_run.evaluate(root, params.evaluate.harness, run, model, tok_manifest,
                                                  root / TOKENS, logs, decon, rounder)
        _harness_files(root, params.evaluate.harness, run, logs)
        metrics_file.write(root, run, metrics, ("eval_metrics", METRICS), ("eval_context", CONTEXT),
                           metrics_file.evaluation_headline)
        print(f"evaluate: validation bits/byte {metrics['bits_per_byte']:.4f} "
              f"(unigram baseline {metrics['unigram_bits_per_byte']:.4f}), perplexity {metrics['perplexity']:.2f}")
        for s in samples:
            print(f"evaluate: {s['prompt']!r} -> {s['completion']!r}")


def _score(root: Path, params: Params, run: Run, model: Loaded, tok_manifest: dict[str, Any],
           rounder: Rounder | None) -> dict[str, dict[str, dict[str, Any]]]:
    """Score the model and the unigram baseline; one eval record per (scorer, corpus) (universal:
    ``rounder`` rounds the per-token NLL, the unigram table and the values, marin.evaluate.universal_scoring)."""
    from marin.data.documents import documents, shard_tokens
    from marin.evaluate import scoring as ev
    from marin.evaluate.universal_scoring import nll_fn
    from marin.ledger import exact
    from marin.ledger.bodies import EvalBody
    from marin.progress import bar

    graphdef, model_params, config = model
    eos = tok_manifest["tokenizer"]["eos_id"]

    def shards(split: str) -> list[Path]:
        return [root / TOKENS / s["file"] for s in tok_manifest["splits"][split]["shards"]]

    val = shards("validation")  # documents are read as scored, twice (model, baseline)
    docs = bar(documents(val), "evaluate", total=tok_manifest["splits"]["validation"]["docs"], unit="doc")
    scored = ev.score(nll_fn(graphdef, rounder), model_params, docs, eos, config["model"]["max_seq_len"],
                      params.evaluate.batch_size)
    counts = ev.token_counts(shard_tokens(shards("train")), config["model"]["vocab_size"])
    table = None if rounder is None else rounder.table("unigram.logp", ev.unigram_logp(counts))
    base = ev.unigram(counts, documents(val), table)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for name, tallies in (("model", scored), ("unigram_baseline", base)):
        for corpus, t in sorted(tallies.items()):
            raw = {"bits_per_byte": t.bits_per_byte, "perplexity": t.perplexity, "nll_nats": t.nll_nats}
            raw = raw if rounder is None else rounder.values(f"{name}.{corpus or 'all'}", raw)  # exp: libm's bits
            values = {**{k: exact(v) for k, v in raw.items()}, "tokens": t.tokens, "bytes": t.bytes, "docs": t.docs}
            body: EvalBody = {"name": name, "split": "validation", "values": values}
            if corpus:
                body["corpus"] = corpus
            run.record("eval", body)
            results.setdefault(name, {})[corpus or "all"] = {
                "bits_per_byte": raw["bits_per_byte"], "perplexity": raw["perplexity"], "tokens": t.tokens}
    return results


def _samples(root: Path, params: Params, run: Run, model: Loaded, tok_manifest: dict[str, Any],
             rounder: Rounder | None) -> list[dict[str, Any]]:
    """Greedy continuations of the fixed prompts, recorded as one eval record."""
    from marin.data import tokenize as tk
    from marin.evaluate.universal_scoring import logits_fn as make_logits_fn
    from marin.model.decode import greedy
    from marin.progress import bar

    graphdef, model_params, config = model
    eos, seq_len = tok_manifest["tokenizer"]["eos_id"], config["model"]["max_seq_len"]
    tokenizer = tk.load(root / TOKENS / "tokenizer.json")
    logits_fn = make_logits_fn(graphdef, rounder)
    samples = []
    for prompt in bar(params.evaluate.prompts, "evaluate: samples", unit="prompt"):
        ids = tokenizer.encode(prompt, add_special_tokens=False).ids  # as in the shards: no special tokens
        out = greedy(logits_fn, model_params, ids, eos, seq_len, params.evaluate.sample_tokens)
        samples.append({"prompt": prompt, "completion": tokenizer.decode(out), "token_ids": out})
    run.record("eval", {"name": "greedy_samples", "split": "prompts",
                        "values": {"tokens_per_sample": params.evaluate.sample_tokens}, "samples": samples})
    return samples


def _metrics(results: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """metrics/eval.json: the model's and the baseline's bits per byte, whole and per corpus."""
    return {"bits_per_byte": results["model"]["all"]["bits_per_byte"],
            "perplexity": results["model"]["all"]["perplexity"],
            "unigram_bits_per_byte": results["unigram_baseline"]["all"]["bits_per_byte"],
            "per_corpus": {c: v["bits_per_byte"] for c, v in results["model"].items() if c != "all"},
            "unigram_per_corpus": {c: v["bits_per_byte"] for c, v in results["unigram_baseline"].items()
                                   if c != "all"}}


def _harness_files(root: Path, hp: HarnessParams, run: Run, logs: dict[str, Any]) -> None:
    """lm-eval's results JSON and samples JSONL of the model's tasks (marin.evaluate.harness_files),
    each recorded as an output before it is published."""
    from marin.evaluate import harness_files as hf
    from marin.evaluate import harness_run

    config = {"model": "marin (models/final)", "limit": hp.limit, "num_fewshot": hp.num_fewshot,
              "random_seed": hp.seed, "numpy_seed": hp.seed, "fewshot_seed": hp.seed,
              "bootstrap_iters": harness_run.BOOTSTRAP_ITERS, "lm_eval_version": harness_run.version()}
    for name, path, data in (("harness_results", hf.RESULTS, hf.results_json(logs, config, root)),
                             ("harness_samples", hf.SAMPLES, hf.samples_jsonl(logs))):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        fsutil.write_bytes(root / path, data, before_publish=lambda tmp, n=name, p=path: run.output(n, p, source=tmp))


def _task_deps(root: Path, hp: HarnessParams) -> list[str]:
    from marin.stages import task_files

    return task_files.listed_paths(root, hp, "evaluate")
