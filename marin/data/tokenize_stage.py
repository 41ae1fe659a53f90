"""Stage tokenize: train a byte-level BPE tokenizer on a bounded sample of the train split (or
use a pinned pretrained one, the chat tokens added where it lacks them), store the chat template
beside it (marin.data.chat), tokenize both splits into Parquet shards of token ids (one row
per document) as they stream, write the manifest."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from tokenizers import Tokenizer

from marin import fsutil, hashing, stages
from marin.config import Params
from marin.data import chat, manifest
from marin.data import tokenize as tk
from marin.data.engine import Engine
from marin.errors import StageError
from marin.ledger import Input, Recipe, Run
from marin.progress import meter

_DECLARED = stages.declaration("tokenize")  # the paths below: marin/stages/table.py
CURATED, OUT = _DECLARED.input("curated"), _DECLARED.out("tokens")
SPLITS = ("train", "validation")


def tokenize_split(root: Path, tmp: Path, split: str, spec: str, params: Params, engine: Engine) -> dict[str, Any]:
    """Encode one split into shards under ``tmp``; its manifest entry, counted as it streams."""
    writer = tk.ShardWriter(tmp, split, params.tokenize.shard_max_tokens)
    docs = tokens = n_bytes = carrying = 0
    corpora: dict[str, dict[str, int]] = {}
    path = root / CURATED / f"{split}.parquet"
    progress = meter(f"tokenize {split}", total=pq.ParquetFile(path).metadata.num_rows, unit=" docs")
    for meta, lengths, ids, n_special in tk.encoded(path, spec, engine):
        writer.add(meta, lengths, ids)
        carrying += n_special
        progress.update(len(lengths))
        for c, n, b in zip(meta["corpus"].to_pylist(), lengths.tolist(), meta["n_bytes"].to_pylist(), strict=True):
            e = corpora.setdefault(c, {"docs": 0, "tokens": 0, "bytes": 0})
            e["docs"], e["tokens"], e["bytes"] = e["docs"] + 1, e["tokens"] + n, e["bytes"] + b
            docs, tokens, n_bytes = docs + 1, tokens + n, n_bytes + b
    progress.close()
    shards = writer.close()
    print(f"tokenize: {split}: {docs} docs, {tokens:,} tokens, "
          f"{n_bytes / max(tokens, 1):.3f} bytes/token, {len(shards)} shard(s)")
    return {"docs": docs, "tokens": tokens, "bytes": n_bytes, "bytes_per_token": round(n_bytes / max(tokens, 1), 6),
            "special_text_docs": carrying, "shards": shards, "corpora": corpora}


def warn_special_text(splits: dict[str, dict[str, Any]], tok: Tokenizer) -> None:
    """One line on stderr when documents hold the string of a special token (encoded as text)."""
    n = {s: e["special_text_docs"] for s, e in splits.items() if e["special_text_docs"]}
    if n:
        each = ", ".join(f"{k} {v:,}" for k, v in n.items())
        print(f"marin: warning: tokenize: {sum(n.values()):,} document(s) ({each}) "
              f"hold the string of a special token ({', '.join(tk.specials(tok))}); encoded as ordinary tokens, "
              "never the special id (special_text_docs in data/tokens/manifest.json)", file=sys.stderr)


def tokenizer_file(root: Path, params: Params, pinned: tk.Pinned | None) -> tuple[bytes, Tokenizer, dict[str, Any]]:
    """The bytes of tokenizer.json, the tokenizer, and the manifest's facts about it: trained
    here on the sample, or the pinned file's own bytes."""
    if pinned is not None:
        print(f"tokenize: pretrained tokenizer {pinned.path} ({pinned.digest})")
        tok = pinned.tokenizer
        added = tk.with_chat_tokens(tok)  # the file's own bytes when it has them all
        if added:
            print(f"tokenize: added the chat tokens {', '.join(added)} to the pretrained tokenizer")
        data = tok.to_str(pretty=True).encode() if added else pinned.data
        return data, tok, {**tk.describe(tok, pinned.eos),
                           "pretrained": {"path": pinned.path, "digest": pinned.digest, "added_tokens": added}}
    sample = tk.Sample(root / CURATED / "train.parquet", params.tokenize.train_sample_bytes)
    tok = tk.train_tokenizer(sample, params.tokenize)
    print(f"tokenize: trained on {sample.docs} docs ({sample.bytes:,} bytes) of the train split")
    return tok.to_str(pretty=True).encode(), tok, tk.describe(tok, tk.EOS)


def refuse_empty(root: Path) -> None:
    """A curated train split with no document is refused before the run starts (from its Parquet
    footer): there is nothing to train a tokenizer or a model on."""
    path = root / CURATED / "train.parquet"
    if path.is_file() and pq.ParquetFile(path).metadata.num_rows == 0:
        raise StageError(f"{CURATED / path.name}: the train split has no document; add data or loosen curate's "
                         "filters, then `dvc repro curate`")


def run_stage(root: Path, params: Params) -> None:
    """The tokenize stage: data/curated into data/tokens, recorded as a ledger run."""
    refuse_empty(root)
    engine = Engine.from_params(params)
    inputs = [Input(s, (CURATED / f"{s}.parquet").as_posix()) for s in SPLITS]
    pretrained = params.tokenize.pretrained
    if pretrained:
        tk.tracked(tk.inside(root, pretrained.path))
    pinned = tk.pretrained(root, pretrained) if pretrained else None  # refused before any run starts
    if pinned is not None:
        inputs.append(Input("pretrained_tokenizer", pinned.path))
    with Run.start(root, Recipe("tokenize", params.section("tokenize"), inputs,
                                 closure=stages.code_files(root, "tokenize"), execution=engine.describe())) as run:
        data, tok, facts = tokenizer_file(root, params, pinned)
        with fsutil.atomic_dir(root / OUT) as tmp:
            fsutil.write_bytes(tmp / "tokenizer.json", data)
            fsutil.write_bytes(tmp / chat.TEMPLATE_FILE, chat.TEMPLATE.encode())
            spec = tok.to_str()  # compact JSON: what each engine task carries
            splits = {s: tokenize_split(root, tmp, s, spec, params, engine) for s in SPLITS}
            warn_special_text(splits, tok)
            digests = {s: hashing.file_digest(root / CURATED / f"{s}.parquet") for s in SPLITS}
            if pinned is not None:
                digests["pretrained_tokenizer"] = pinned.digest
            manifest.write({
                "kind": "tokenize", "params": params.raw["tokenize"], "inputs": digests,
                "tokenizer": {"file": "tokenizer.json", "digest": hashing.file_digest(tmp / "tokenizer.json"),
                              **facts, "chat_template": {"file": chat.TEMPLATE_FILE,
                                                         "digest": hashing.file_digest(tmp / chat.TEMPLATE_FILE)}},
                "splits": splits,
            }, tmp / "manifest.json")
            run.output("tokenizer", OUT / "tokenizer.json", source=tmp / "tokenizer.json")  # recorded, then published
            run.output("chat_template", OUT / chat.TEMPLATE_FILE, source=tmp / chat.TEMPLATE_FILE)
            run.output("tokenize_manifest", OUT / "manifest.json", source=tmp / "manifest.json")
            run.output("tokens", OUT, source=tmp)

