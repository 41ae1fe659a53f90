"""The instruct project every Base-and-Instruct test starts from (a pytest plugin: tests/conftest.py):
the mini corpus's shape in two disjoint vocabularies, a tiny model, 64-token rows and a short
fine-tune, built once per session and copied by the tests that change it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.conftest import WORDS, Project, copy_project, mini_params, new_project, shared, tiny

SFT = {"steps": 150, "batch_size": 16, "lr": 5.0e-3, "schedule": "cosine", "warmup_steps": 10, "min_lr_ratio": 0.1,
       "wsd_decay_fraction": 0.2, "weight_decay": 0.0, "beta1": 0.9, "beta2": 0.95, "eps": 1.0e-8,
       "grad_clip": 1.0, "log_every": 10, "checkpoint_every": 50}
INSTRUCTIONS = {"salt": "marin-instructions-v1", "per_document": 16, "heldout_max": 64,
                "tasks": ["corpus", "reference"], "eval_tokens": 8}  # short answers: a tiny model learns them


def instruct_params(proj: Project, **sft: object) -> None:
    params = proj.params
    params["model"]["seq_len"] = 64  # a question and its answer fit a row
    params["sft"] = {**SFT, **sft}
    params["instructions"] = INSTRUCTIONS
    proj.write_params(params)


def lines(rng: random.Random, words: list[str], n: int) -> list[str]:
    return [" ".join(rng.choice(words) for _ in range(rng.randint(6, 12))).capitalize() + "." for _ in range(n)]


def make_instruct_corpus(dest: Path) -> Path:
    """Prose files and verse chapters (the mini corpus's layout) in two disjoint vocabularies."""
    rng, half = random.Random(27), len(WORDS) // 2
    (dest / "texts").mkdir(parents=True)
    for i in range(12):
        (dest / "texts" / f"doc{i:02d}.txt").write_text("\n".join(lines(rng, WORDS[:half], 40)) + "\n")
    with open(dest / "verses.jsonl", "w") as f:
        for book in ("Alpha", "Beta", "Gamma", "Delta"):
            for chapter in (1, 2, 3):
                for verse, text in enumerate(lines(rng, WORDS[half:], 8), 1):
                    f.write(json.dumps({"book": book, "chapter": chapter, "verse": verse, "text": text}) + "\n")
    return dest


def _build_sft(dest: Path) -> None:
    corpus = make_instruct_corpus(dest / "corpus" / "mini")
    proj = new_project(dest / "proj", mini_params(corpus))
    tiny(proj)
    instruct_params(proj)
    proj.git("commit", "-qam", "instruct params")
    for stage in ("fetch", "curate", "tokenize", "train", "instructions", "sft", "evaluate_instruct",
                  "export_instruct"):
        proj.stage(stage)


@pytest.fixture(scope="session")
def _sft_project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    """Built once per session whatever the number of xdist workers (read only: tests copy it)."""
    return Project(shared(tmp_path_factory, "sft", _build_sft) / "proj")


@pytest.fixture
def sft_project(tmp_path: Path, _sft_project: Project) -> Project:
    """A copy of a project whose pipeline ran through sft (tiny model)."""
    return copy_project(_sft_project, tmp_path / "proj")
