"""Stage evaluate: bits per byte and perplexity of the trained model on the validation
split (whole and per corpus) beside a unigram baseline on the same tokens, and greedy
samples from fixed prompts. Writes metrics/eval.json (DVC metrics) and eval records."""

import json
from pathlib import Path

from marin import fsutil
from marin.config import Params, RuntimeParams
from marin.stage import stage_main
from marin.train import runtime

MODEL, TOKENS, METRICS = Path("models/final"), Path("data/tokens"), Path("metrics/eval.json")


def evaluate_stage(root: Path, params: Params) -> None:
    rt = RuntimeParams(params.runtime.xla_cpu_threads, 1, "replicated",  # scoring needs no mesh
                       determinism=params.runtime.determinism)
    runtime.configure(rt)
    import jax
    from flax import nnx

    from marin import env
    from marin import evaluate as ev
    from marin.data import manifest
    from marin.data import tokenize as tk
    from marin.ledger import Input, Run, exact
    from marin.progress import bar
    from marin.train import step, weights

    fp = env.fingerprint()
    inputs = [Input("model", MODEL.as_posix()), Input("tokens", TOKENS.as_posix())]
    recorded = {**params.section("evaluate"),
                "runtime": {"xla_cpu_threads": rt.xla_cpu_threads, "determinism": rt.determinism}}
    with Run.start(root, "evaluate", params=recorded, inputs=inputs,
                   det_class=runtime.determinism_class(rt, fp), fingerprint=fp) as run:
        graphdef, model_params, config = weights.load(root / MODEL)
        seq_len = config["model"]["max_seq_len"]
        tok_manifest = manifest.read(root / TOKENS / "manifest.json", "tokenize")
        eos = tok_manifest["tokenizer"]["eos_id"]

        def shards(split: str) -> list[Path]:
            return [root / TOKENS / s["file"] for s in tok_manifest["splits"][split]["shards"]]

        val = shards("validation")  # documents are read as scored, twice (model, baseline)
        docs = bar(ev.documents(val), "evaluate", total=tok_manifest["splits"]["validation"]["docs"], unit="doc")
        model = ev.score(step.eval_nll_fn(graphdef), model_params, docs, eos, seq_len, params.evaluate.batch_size)
        counts = ev.token_counts(ev.shard_tokens(shards("train")), config["model"]["vocab_size"])
        base = ev.unigram(counts, ev.documents(val))
        results = {}
        for name, tallies in (("model", model), ("unigram_baseline", base)):
            for corpus, t in sorted(tallies.items()):
                values = {"bits_per_byte": exact(t.bits_per_byte), "perplexity": exact(t.perplexity),
                          "nll_nats": exact(t.nll_nats), "tokens": t.tokens, "bytes": t.bytes, "docs": t.docs}
                body = {"name": name, "split": "validation", "values": values}
                if corpus:
                    body["corpus"] = corpus
                run.record("eval", body)
                results.setdefault(name, {})[corpus or "all"] = {
                    "bits_per_byte": t.bits_per_byte, "perplexity": t.perplexity, "tokens": t.tokens}

        tokenizer = tk.load(root / TOKENS / "tokenizer.json")
        logits_fn = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))
        samples = []
        for prompt in bar(params.evaluate.prompts, "evaluate: samples", unit="prompt"):
            ids = tokenizer.encode(prompt, add_special_tokens=False).ids  # as in the shards: no special tokens
            out = ev.greedy(logits_fn, model_params, ids, eos, seq_len, params.evaluate.sample_tokens)
            samples.append({"prompt": prompt, "completion": tokenizer.decode(out), "token_ids": out})
        run.record("eval", {"name": "greedy_samples", "split": "prompts",
                            "values": {"tokens_per_sample": params.evaluate.sample_tokens}, "samples": samples})

        metrics = {"bits_per_byte": results["model"]["all"]["bits_per_byte"],
                   "perplexity": results["model"]["all"]["perplexity"],
                   "unigram_bits_per_byte": results["unigram_baseline"]["all"]["bits_per_byte"],
                   "per_corpus": {c: v["bits_per_byte"] for c, v in results["model"].items() if c != "all"},
                   "unigram_per_corpus": {c: v["bits_per_byte"] for c, v in results["unigram_baseline"].items()
                                          if c != "all"}}
        fsutil.write_bytes(root / METRICS, (json.dumps(metrics, indent=2, sort_keys=True) + "\n").encode(),
                           before_publish=lambda tmp: run.output("eval_metrics", METRICS, source=tmp))
        print(f"evaluate: validation bits/byte {metrics['bits_per_byte']:.4f} "
              f"(unigram baseline {metrics['unigram_bits_per_byte']:.4f}), perplexity {metrics['perplexity']:.2f}")
        for s in samples:
            print(f"evaluate: {s['prompt']!r} -> {s['completion']!r}")


if __name__ == "__main__":
    stage_main(evaluate_stage)
