"""The harness tasks' data and bookkeeping, as pure functions: works named from curated document
names, passages cut verbatim and deterministically, the few-shot pool disjoint from the test
passages, and the per-sample digest and local-data check of marin.evaluate.harness_run."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from pathlib import Path

import pytest

from marin.data import evalsets as es
from marin.evaluate import harness_run as hr

from .conftest import make_text


def _docs(n: int, lines: int = 30) -> list[es.Doc]:
    rng = random.Random(11)
    return [es.Doc(f"sha256:{i:064x}", "prose" if i % 2 else "verse", f"texts/work_{i % 5}_gut.txt", "CC0-1.0",
                   make_text(rng, lines)) for i in range(n)]


def test_passages_are_verbatim_non_overlapping_and_end_on_a_word() -> None:
    doc = _docs(1, 60)[0]
    words = doc.text.split()
    got = es.passages(doc, 24)
    assert len(got) == es.PER_DOC and got == es.passages(doc, 24)  # the same draw every time
    for start, ws in got:
        assert ws == words[start:start + 24] and ws[-1].isalpha() and len(ws[-1]) >= 3
    starts = [s for s, _ in got]
    assert all(b - a >= 24 for a, b in itertools.pairwise(starts))
    short = es.Doc("sha256:" + "1" * 64, "c", "n.txt", "x", " ".join(["word"] * 40))
    assert {len(ws) for _, ws in es.passages(short, 24)} == {10}  # 40 words: four passages of 10


def test_build_is_deterministic_and_the_shots_are_disjoint_from_the_test() -> None:
    docs = _docs(12)
    out = es.build(docs)
    again = es.build(list(reversed(docs)))
    assert [es.jsonl(out[k]) for k in out] == [es.jsonl(again[k]) for k in again]  # order-free
    assert out["cloze_shots"] and not {i["id"] for i in out["cloze"]} & {i["id"] for i in out["cloze_shots"]}
    assert len(out["cloze_shots"]) == len(out["cloze"] + out["cloze_shots"]) // 8
    golds = [it["gold"] for it in out["next_word"]]
    assert len(set(golds)) > 1  # the right answer is not always in one place


def test_next_word_items_end_the_passage_and_their_distractors_match_its_frequency() -> None:
    docs = _docs(12)
    counts = {c: Counter(w for d in docs if d.corpus == c for w in d.text.split() if w.isalpha() and len(w) >= 3)
              for c in ("prose", "verse")}
    items = es.build(docs)["next_word"]
    assert items
    for it in items:
        doc = next(d for d in docs if d.doc_id == it["doc_id"])
        truth = it["choices"][it["gold"]]
        assert f"{it['context']} {truth}" in " ".join(doc.text.split())  # verbatim, the true word last
        assert len({c.casefold() for c in it["choices"]}) == 4
        c = counts[it["corpus"]]
        ranked = sorted(c.values())  # every word's count, ascending: 8 places either side of the true word's
        lo, hi = ranked.index(c[truth]), len(ranked) - 1 - ranked[::-1].index(c[truth])
        for w in it["choices"]:
            assert ranked[max(lo - 8, 0)] <= c[w] <= ranked[min(hi + 8, len(ranked) - 1)], (w, truth)


@pytest.mark.parametrize(("truth", "ordered", "at", "expected"), [
    ("b", ["a", "b", "c", "d"], 1, {"a", "c", "d"}),  # all neighbours
    ("B", ["b", "B", "x", "y", "z"], 1, {"x", "y", "z"}),  # the same word in another case is never a wrong option
    ("a", ["a"], 0, set()),  # no neighbour: no item
])
def test_distractors_are_neighbours_in_count_order(truth: str, ordered: list[str], at: int,
                                                   expected: set[str]) -> None:
    assert set(es.distractors(truth, ordered, at, "k")) == expected


def test_per_sample_digest_covers_every_loglikelihood_bit() -> None:
    samples = [{"doc_id": 1, "resps": [[(-1.5, True)], [(-2.25, False)]]}, {"doc_id": 0, "resps": [[(-0.5, False)]]}]
    assert hr.per_sample(samples) == [[0, [[(-0.5).hex(), False]]],
                                      [1, [[(-1.5).hex(), True], [(-2.25).hex(), False]]]]
    nudged = [{**samples[0], "resps": [[(-1.5 + 2**-40, True)], [(-2.25, False)]]}, samples[1]]
    assert hr.samples_digest(nudged) != hr.samples_digest(samples)


def test_missing_data_names_the_task_and_the_file(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text("{}\n")
    local = {"dataset_path": "json", "dataset_kwargs": {"data_files": {"test": "d.jsonl"}}}
    assert hr.missing_data(tmp_path, "t", local) is None
    gone = {"dataset_path": "json", "dataset_kwargs": {"data_files": {"test": ["d.jsonl", "e.jsonl"]}}}
    assert "harness task 't': data file e.jsonl is missing" in hr.missing_data(tmp_path, "t", gone)
    assert "is not local" in hr.missing_data(tmp_path, "t", {"dataset_path": "org/hub_set"})
    assert "without dataset_kwargs.data_files" in hr.missing_data(tmp_path, "t", {"dataset_path": "json"})


def test_the_harness_runs_offline_with_a_throwaway_cache(tmp_path: Path) -> None:
    import datasets.config as dc

    home, cwd = dc.HF_DATASETS_CACHE, Path.cwd()
    with hr.offline(tmp_path):
        assert dc.HF_DATASETS_OFFLINE is True and dc.HF_HUB_OFFLINE is True
        cache = dc.HF_DATASETS_CACHE
        assert cache != home and cache.is_dir() and Path.cwd() == tmp_path
    assert home == dc.HF_DATASETS_CACHE and Path.cwd() == cwd and not cache.exists()
