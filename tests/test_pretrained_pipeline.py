"""A pretrained tokenizer end to end (issue 12): a ``tokenizer.json`` made here with the
tokenizers library, pinned in params, flows through tokenize (run by DVC), train and
evaluate; the model's vocabulary is the file's, the tokenize run verifies, and DVC sees the file
change (a changed file under the old pin stops tokenize with one line naming it). The file lacks three of
the chat tokens (its end-of-text token is ``<|end|>``): tokenize adds them after its vocabulary, and
records that."""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tests.conftest import Project, make_text, tiny

pytestmark = pytest.mark.slow

EOS = "<|end|>"  # not marin's own end-of-text token: the pin's eos is what the shards use
VOCAB = 397  # + the 3 chat tokens added = 400, the mini corpus's trained vocabulary too: the tiny model's
ADDED = ["<|system|>", "<|user|>", "<|assistant|>"]  # compiled shapes are reused


def bpe(path: Path) -> Tokenizer:
    """A byte-level BPE trained on text of its own (another seed than the corpus), saved at ``path``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=1, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    rng = random.Random(2026)
    tok.train_from_iterator([make_text(rng, 30) for _ in range(40)], trainer=trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return tok


def pin(proj: Project, rel: str, **tokenize: object) -> str:
    sha = hashlib.sha256((proj.root / rel).read_bytes()).hexdigest()
    params = proj.params
    params["tokenize"].update(tokenize, pretrained={"path": rel, "sha256": sha, "eos": EOS})
    proj.write_params(params)
    proj.git("add", "-A")
    proj.git("commit", "-qm", f"pretrained tokenizer {sha[:12]}")
    return sha


def test_a_pretrained_tokenizer_flows_through_train_and_evaluate(data_project: Project) -> None:
    proj, rel = data_project, "tokenizer/tiny.json"
    tok = bpe(proj.root / rel)
    assert tok.get_vocab_size() == VOCAB and tok.token_to_id(EOS) is not None
    tiny(proj)
    (proj.root / "tiny.json").write_bytes((proj.root / rel).read_bytes())  # outside tokenizer/: DVC would not see it
    pin(proj, "tiny.json")
    ledger = proj.ledger_files()
    r = proj.stage("tokenize", check=False)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and proj.ledger_files() == ledger, r.stderr
    assert "tokenize.pretrained.path: tiny.json is not in tokenizer/" in r.stderr
    sha = pin(proj, rel, vocab_size=512)  # ignored with a pretrained tokenizer
    r = proj.dvc("repro", "--single-item", "tokenize")
    assert "Running stage 'tokenize'" in r.stdout, r.stdout

    m = json.loads((proj.root / "data/tokens/manifest.json").read_text())
    assert m["tokenizer"]["vocab_size"] == VOCAB + 3 and m["tokenizer"]["eos_id"] == tok.token_to_id(EOS)
    assert m["tokenizer"]["pretrained"] == {"path": rel, "digest": f"sha256:{sha}", "added_tokens": ADDED}
    used = Tokenizer.from_file(str(proj.root / "data/tokens/tokenizer.json"))  # the file and the chat tokens
    assert [used.token_to_id(t) for t in ADDED] == [VOCAB, VOCAB + 1, VOCAB + 2]
    assert used.get_vocab() == {**tok.get_vocab(), **{t: VOCAB + i for i, t in enumerate(ADDED)}}
    texts = pq.read_table(proj.root / "data/curated/validation.parquet")["text"].to_pylist()
    assert m["splits"]["validation"]["tokens"] == sum(len(e.ids) for e in tok.encode_batch(texts))

    proj.stage("train")
    proj.stage("evaluate")
    config = json.loads((proj.root / "models/final/config.json").read_text())
    assert config["model"]["vocab_size"] == VOCAB + 3
    shapes = {k: v.shape for k, v in load_file(str(proj.root / "models/final/model.safetensors")).items()}
    assert (VOCAB + 3, config["model"]["d_model"]) in shapes.values(), shapes  # the embedding table
    [evaluate] = proj.runs("evaluate")
    [samples] = [r["body"]["samples"] for r in evaluate if r["kind"] == "eval"
                 and r["body"]["name"] == "greedy_samples"]
    for s in samples:  # generated ids are the file's, decoded by it
        assert all(0 <= i < VOCAB + 3 for i in s["token_ids"]) and s["completion"] == used.decode(s["token_ids"])
    assert json.loads((proj.root / "metrics/eval.json").read_text())["bits_per_byte"] > 0

    v = proj.marin("verify", proj.runs("tokenize")[-1][0]["run_id"])  # replayed with the pinned file
    assert v.returncode == 0, v.stdout + v.stderr

    # the file changes under the old pin: DVC sees the dependency change, the stage refuses it
    (proj.root / rel).write_bytes((proj.root / rel).read_bytes() + b"\n")
    assert re.search(r"modified:\s+tokenizer", proj.dvc("status", "tokenize").stdout)
    ledger, tokens = proj.ledger_files(), proj.tree("data/tokens")
    r = proj.dvc("repro", "--single-item", "tokenize", check=False)
    new = hashlib.sha256((proj.root / rel).read_bytes()).hexdigest()
    line = f"marin: error: tokenize.pretrained.sha256: {rel} hashes to sha256:{new}, the params pin sha256:{sha};"
    assert r.returncode != 0 and [ln for ln in r.stderr.splitlines() if ln.startswith("marin:")] == [
        ln for ln in r.stderr.splitlines() if ln.startswith(line)], r.stderr
    assert line in r.stderr and proj.ledger_files() == ledger and proj.tree("data/tokens") == tokens
    # pinned anew: DVC runs tokenize again
    pin(proj, rel)
    assert "Running stage 'tokenize'" in proj.dvc("repro", "--single-item", "tokenize").stdout
