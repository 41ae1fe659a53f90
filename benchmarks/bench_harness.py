"""lm-evaluation-harness requests per second: the JAX adapter (marin.evaluate.harness.MarinLM)
beside lm-eval's own ``hf`` model on the transformers export of the same weights, on the same CPU
threads, over the same ``loglikelihood`` requests (the built-in tasks' shape: multiple choice and
cloze), side by side.

    uv run python benchmarks/bench_harness.py                      # the default model size, synthetic data
    uv run python benchmarks/bench_harness.py --project .          # this project's model, tokenizer, evalsets

Without ``--project`` (or where it lacks models/final, data/tokens or data/evalsets) the model is
params.yaml's ``model`` at random init and the text synthetic: requests/s depends on the shapes,
not the weights. Each side runs a warm-up pass first (JAX compiles one function per padded
length; torch allocates), then the timed pass. Needs the hf group (torch, transformers).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORDS = ["the", "and", "of", "to", "in", "that", "is", "was", "he", "for", "it", "with", "as", "his", "on", "be",
         "at", "by", "had", "not", "are", "but", "from", "or", "have", "an", "they", "which", "one", "you", "were",
         "king", "lord", "love", "death", "night", "heart", "heaven", "earth", "light", "sword", "crown", "grace",
         "honour", "blood", "fair", "sweet"]


def synthetic(tmp: Path, params: Any) -> tuple[Path, list[tuple[str, str]]]:
    """A project-like folder (models/final, models/hf, data/tokens/tokenizer.json) at random init, and requests."""
    from flax import nnx

    from marin.config import TokenizeParams
    from marin.data import tokenize as tk
    from marin.export import hf
    from marin.export.export_stage import read_model
    from marin.model.transformer import ModelConfig, Transformer
    from marin.train import weights

    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 200))) for _ in range(400)]
    tok = tk.train_tokenizer(texts, TokenizeParams(params.tokenize.vocab_size, 2, 1))
    (tmp / "data/tokens").mkdir(parents=True)
    tok.save(str(tmp / "data/tokens/tokenizer.json"))
    m = params.model
    cfg = ModelConfig.from_params(m, tok.get_vocab_size())
    state = nnx.to_pure_dict(nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))[1])  # as the train stage saves it
    eos = tok.token_to_id(tk.EOS)
    weights.save(tmp / "models/final", state, cfg, {"tokenizer": {"eos_id": eos}})
    tensors, config = read_model(tmp / "models/final")
    (tmp / "models/hf").mkdir(parents=True)
    for name, data in hf.files(tensors, config, (tmp / "data/tokens/tokenizer.json").read_bytes(), tk.EOS,
                               {}).items():
        (tmp / "models/hf" / name).write_bytes(data)
    reqs = []
    for t in texts:
        w = t.split()
        reqs += [(" ".join(w[:24]) + "\nThis passage is from", " " + rng.choice(WORDS)) for _ in range(4)]
        reqs.append((" ".join(w[:-1]), " " + w[-1]))
    return tmp, reqs


def project_requests(root: Path) -> list[tuple[str, str]]:
    """The built-in tasks' requests from data/evalsets: four per source question, one per cloze passage."""
    reqs = []
    for line in (root / "data/evalsets/source.jsonl").read_text().splitlines():
        it = json.loads(line)
        reqs += [(f"{it['passage']}\nThis passage is from", f" {c}") for c in it["choices"]]
    for line in (root / "data/evalsets/cloze.jsonl").read_text().splitlines():
        it = json.loads(line)
        reqs.append((it["context"], " " + it["target"]))
    return reqs


def timed(lm: Any, reqs: list[Any], warm: int) -> tuple[float, list[float]]:
    lm.loglikelihood(reqs[:warm], disable_tqdm=True)
    t0 = time.perf_counter()
    out = lm.loglikelihood(reqs, disable_tqdm=True)
    return time.perf_counter() - t0, [ll for ll, _ in out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--project", type=Path, help="a project with models/final, models/hf, data/tokens, data/evalsets")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()

    from marin import config
    from marin.config import RuntimeParams
    from marin.train import runtime

    params = config.load(ROOT / "params.yaml")
    runtime.configure(RuntimeParams(params.runtime.xla_cpu_threads, 1, "replicated",
                                    determinism=params.runtime.determinism))  # as the evaluate stage
    import torch
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from marin.data import tokenize as tk
    from marin.evaluate.harness import MarinLM
    from marin.model import weights

    torch.set_num_threads(params.runtime.xla_cpu_threads)  # the same cores for both
    logging.getLogger("lm_eval").setLevel(logging.ERROR)  # one truncation note per long request otherwise
    with tempfile.TemporaryDirectory() as tmp:
        p = args.project
        if p and all((p / d).exists() for d in ("models/final", "models/hf", "data/tokens", "data/evalsets")):
            root, pairs, what = p, project_requests(p), f"project {p}"
        else:
            (root, pairs), what = synthetic(Path(tmp), params), "random init, synthetic text"
        pairs = (pairs * (args.requests // max(1, len(pairs)) + 1))[:args.requests]
        reqs = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
        graphdef, state, cfg = weights.load(root / "models/final")
        tok = tk.load(root / "data/tokens/tokenizer.json")
        seq_len = cfg["model"]["max_seq_len"]
        ours = MarinLM(graphdef, state, tok, tok.token_to_id(tk.EOS), seq_len, batch_size=args.batch_size)
        theirs = HFLM(pretrained=str(root / "models/hf"), backend="causal", device="cpu", batch_size=args.batch_size,
                      dtype="float32", max_length=seq_len, add_bos_token=False)
        warm = 4 * args.batch_size
        jax_s, jax_ll = timed(ours, reqs, warm)
        hf_s, hf_ll = timed(theirs, reqs, warm)
    gap = max(abs(a - b) for a, b in zip(jax_ll, hf_ll, strict=True))
    n = len(reqs)
    print(f"{what}; model d_model={cfg['model']['d_model']} layers={cfg['model']['n_layers']} seq_len={seq_len}; "
          f"{n} loglikelihood requests, batch {args.batch_size}, {params.runtime.xla_cpu_threads} threads")
    print(f"{'':24}{'seconds':>10}{'requests/s':>12}")
    print(f"{'JAX adapter (MarinLM)':24}{jax_s:10.2f}{n / jax_s:12.1f}")
    print(f"{'lm-eval hf (torch)':24}{hf_s:10.2f}{n / hf_s:12.1f}")
    print(f"ratio JAX / hf: {hf_s / jax_s:.2f}; largest per-request log-likelihood difference {gap:.2e}")


if __name__ == "__main__":
    main()
