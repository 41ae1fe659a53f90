"""Stage tokenize: train a byte-level BPE tokenizer on the train split, tokenize both
splits into Parquet shards of token ids (one row per document), write the manifest."""

import sys
from pathlib import Path

from marin import fsutil, hashing
from marin.config import Params
from marin.data import manifest, parquet
from marin.data import tokenize as tk
from marin.ledger import Input, Run
from marin.stage import stage_main

CURATED, OUT = Path("data/curated"), Path("data/tokens")


def tokenize_stage(root: Path, params: Params) -> None:
    inputs = [Input(s, (CURATED / f"{s}.parquet").as_posix()) for s in ("train", "validation")]
    with Run.start(root, "tokenize", params=params.section("tokenize"), inputs=inputs) as run:
        tables = {s: parquet.read(root / CURATED / f"{s}.parquet") for s in ("train", "validation")}
        print(f"tokenize: training the tokenizer on {tables['train'].num_rows} documents", file=sys.stderr)
        tok = tk.train_tokenizer(tables["train"]["text"].to_pylist(), params.tokenize)
        with fsutil.atomic_dir(root / OUT) as tmp:
            fsutil.write_bytes(tmp / "tokenizer.json", tok.to_str(pretty=True).encode())
            splits = {}
            for split, table in tables.items():
                ids = tk.encode(tok, table["text"].to_pylist(), f"tokenize {split}")
                shards = tk.write_shards(tmp, split, table, ids, params.tokenize.shard_max_tokens)
                n_tokens, n_bytes = sum(len(x) for x in ids), sum(table["n_bytes"].to_pylist())
                corpora: dict[str, dict[str, int]] = {}
                for c, x, b in zip(table["corpus"].to_pylist(), ids, table["n_bytes"].to_pylist(), strict=True):
                    e = corpora.setdefault(c, {"docs": 0, "tokens": 0, "bytes": 0})
                    e["docs"], e["tokens"], e["bytes"] = e["docs"] + 1, e["tokens"] + len(x), e["bytes"] + b
                splits[split] = {"docs": table.num_rows, "tokens": n_tokens, "bytes": n_bytes,
                                 "bytes_per_token": round(n_bytes / max(n_tokens, 1), 6),
                                 "shards": shards, "corpora": corpora}
                print(f"tokenize: {split}: {table.num_rows} docs, {n_tokens:,} tokens, "
                      f"{n_bytes / max(n_tokens, 1):.3f} bytes/token, {len(shards)} shard(s)")
            manifest.write({
                "kind": "tokenize", "params": params.raw["tokenize"],
                "inputs": {s: hashing.file_digest(root / CURATED / f"{s}.parquet") for s in tables},
                "tokenizer": {"file": "tokenizer.json", "digest": hashing.file_digest(tmp / "tokenizer.json"),
                              "type": "byte-level BPE", "vocab_size": tok.get_vocab_size(),
                              "special_tokens": tk.SPECIAL_TOKENS, "eos_id": tok.token_to_id(tk.EOS),
                              "library": "tokenizers"},
                "splits": splits,
            }, tmp / "manifest.json")
            run.output("tokenizer", OUT / "tokenizer.json", source=tmp / "tokenizer.json")  # recorded, then published
            run.output("tokenize_manifest", OUT / "manifest.json", source=tmp / "manifest.json")
            run.output("tokens", OUT, source=tmp)


if __name__ == "__main__":
    stage_main(tokenize_stage)
