"""`marin trace` in memory linear in its text (issue 55, defect 3): the search (marin/evaluate/sa_search.py)
against brute force on random token arrays, a 100 KB verbatim passage traced in a measured child process,
a text over the token cap and an argument that is not UTF-8 refused in one line, and a full disk during
stage trace_index ending in one line with the ledger valid and every earlier run file unchanged."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from marin.evaluate import sa_search, trace_index
from tests import proc
from tests.conftest import Project
from tests.test_bounded import bounded, ledger_kept, refused, run
from tests.test_faults import FILLER, PAGE, assert_no_torn_line, fill, one_error_line, small_disk

# -- the search against brute force ------------------------------------------------------------------


def _reference(docs: list[np.ndarray], q: np.ndarray) -> tuple[list[int], dict[tuple[int, int], int]]:
    """Per position of ``q`` its longest run found in a document, and each maximal run's occurrences, by
    substring search over the documents as strings (one character a token, a newline between documents)."""
    def text(ids: np.ndarray) -> str:
        return "".join(chr(0x100 + int(t)) for t in ids)

    corpus, s = "\n".join(text(d) for d in docs), text(q)
    longest = []
    for i in range(len(q)):
        n = 0
        while i + n < len(q) and s[i:i + n + 1] in corpus:
            n += 1
        longest.append(n)

    def count(p: str) -> int:
        return sum(corpus.startswith(p, j) for j in range(len(corpus)))

    return longest, {(i, n): count(s[i:i + n]) for i, n in enumerate(longest) if n}


def _docs(rng: np.random.Generator, case: str) -> tuple[list[np.ndarray], np.ndarray]:
    """The documents and the query of a case."""
    vocab = {"one symbol": 1, "two symbols": 2, "large ids": 60_000}.get(case, 6)
    docs = [rng.integers(0, vocab, rng.integers(0, 120)) for _ in range(12)]
    if case == "repeated document":
        docs += [docs[0], docs[0]]
    pieces = {
        "verbatim": [docs[1][5:]],
        "past a document's end": [docs[2][-30:], docs[3][:40]],
        "mosaic": [d[j:j + 25] for d in docs[:6] for j in (0, 30)],
        "nothing matches": [rng.integers(vocab, vocab + 5, 80)],
        "empty query": [np.zeros(0, dtype=np.int64)],
        "repeated document": [docs[0], docs[0][:50]],
    }.get(case, [rng.integers(0, vocab, rng.integers(40, 200))])
    return docs, np.concatenate(pieces).astype(np.int64)


CASES = ["one symbol", "two symbols", "large ids", "random", "verbatim", "past a document's end", "mosaic",
         "nothing matches", "empty query", "repeated document"]
SETTINGS = {  # (WINDOW, BUDGET, AHEAD): the shipped ones, and small ones that take every path of the two passes
    "shipped": (sa_search.WINDOW, sa_search.BUDGET, sa_search.AHEAD),
    "window 1": (1, 3, 1),
    "window 3": (3, 16, 2),
    "window 8": (8, 50, 4),
}


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("case", CASES)
def test_the_linear_search_agrees_with_brute_force(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str,
                                                   setting: str) -> None:
    for name, value in zip(("WINDOW", "BUDGET", "AHEAD"), SETTINGS[setting], strict=True):
        monkeypatch.setattr(sa_search, name, value)
    for seed in range(3):
        rng = np.random.default_rng([seed, CASES.index(case)])
        docs, q = _docs(rng, case)
        trace_index.build((trace_index.Doc(f"d{i}", "c", "s", "L", d) for i, d in enumerate(docs)),
                          tmp_path / str(seed), 100)
        index = trace_index.Index(tmp_path / str(seed))
        longest, counts = _reference(docs, q)
        got = index.longest(q)
        assert got.dtype == np.int64 and got.tolist() == longest
        want, reach = [], -1
        for i, n in enumerate(longest):  # maximal: not inside a span that starts earlier
            if i + n > reach and n >= 1:
                want.append((i, n, counts[i, n]))
            reach = max(reach, i + n)
        assert [(s.start, s.length, s.count) for s in index.spans(q, 1, got)] == want


# -- a long text, in a child process -----------------------------------------------------------------

PASSAGE = 30_000  # tokens: more than 100 KB of the shipped corpus's text (about 4 bytes a token)
CHILD = """
import json, sys
from pathlib import Path
import numpy as np
from marin.evaluate.trace_index import Index
index, out = Index(Path(sys.argv[1])), []
for name in ("verbatim", "mosaic"):
    q = np.load(Path(sys.argv[1]).parent / f"{name}.npy")
    spans = index.spans(q, 8)
    out.append([[s.start, s.length, s.count] for s in spans])
print(json.dumps(out))
"""


def test_a_100_kb_verbatim_passage_is_traced_in_bounded_memory_and_time(tmp_path: Path) -> None:
    """A passage of 30,000 tokens and a mosaic of 100 passages of 300: the old search held a 30,000 x
    30,000 matrix of int64 (7.2 GB) for each."""
    rng = np.random.default_rng(55)
    cdf = np.cumsum(1.0 / np.arange(1, 4097))
    docs = [np.searchsorted(cdf / cdf[-1], rng.random(n)) for n in [PASSAGE + 1000] + [500] * 200]
    trace_index.build((trace_index.Doc(f"d{i}", "c", "s", "L", d) for i, d in enumerate(docs)),
                      tmp_path / "index", 1 << 20)
    np.save(tmp_path / "verbatim.npy", docs[0][500:500 + PASSAGE])
    picks = [docs[1 + i][100:400] for i in range(100)]
    np.save(tmp_path / "mosaic.npy", np.concatenate(picks))
    child = proc.measure(tmp_path, sys.executable, "-c", CHILD, str(tmp_path / "index"), env={**os.environ},
                         timeout=120, as_limit=3 << 30, cpu_limit_s=60)
    assert child.code == 0, child.stderr[-2000:]
    bounded(child)
    verbatim, mosaic = json.loads(child.stdout)
    assert verbatim == [[0, PASSAGE, 1]]
    assert len(mosaic) == 100 and all(n >= 300 and c >= 1 for _, n, c in mosaic)


# -- `marin trace` on a trained project --------------------------------------------------------------


@pytest.mark.slow
def test_a_text_over_the_token_cap_is_refused_in_one_line(trained_project: Project, tmp_path: Path) -> None:
    proj = trained_project
    before = proj.ledger_files()
    params = proj.params
    params.setdefault("trace", {})["max_query_tokens"] = 20
    proj.write_params(params)
    line = refused(run(proj, "-m", "marin.cli", "trace", "the king " * 30), 1,
                   "tokens, over the 20 `marin trace` takes (trace.max_query_tokens)")
    assert line.startswith("marin: error: the text is ")
    big = tmp_path / "big.txt"  # 2 MB: refused before the tokenizer sees it
    big.write_text("the king " * 230_000)
    del params["trace"]["max_query_tokens"]
    proj.write_params(params)
    refused(run(proj, "-m", "marin.cli", "trace", "--file", str(big)), 1,
            "the text is 2,070,000 characters, more than 16 for each of the 65,536 tokens")
    ledger_kept(proj, before)


@pytest.mark.slow
def test_a_text_argument_that_is_not_utf8_is_one_line(trained_project: Project) -> None:
    text = os.fsdecode(b"the k\xe9ing")  # as Python hands an argument of these bytes over
    refused(run(trained_project, "-m", "marin.cli", "trace", text), 1,
            "the TEXT argument is not UTF-8 (byte 5)", "--file")


def _du_kib(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file()) // 1024


@pytest.mark.slow
def test_a_full_disk_during_trace_index_is_one_line(trained_project: Project) -> None:
    """numpy's tofile said only "OSError: 2048 requested and 21504 written", a traceback."""
    proj = trained_project
    data = proj.root / "data"
    before, tree = proj.ledger_files(), proj.tree("data")
    table = math.ceil((data / "trace_index/docs.jsonl").stat().st_size / PAGE)
    assert (data / "trace_index/tokens.u32").stat().st_size > (table + 2) * PAGE
    with small_disk(data, _du_kib(data) + 1024):
        fill(data, table + 1)  # room for the document table, written first, not for the tokens of its one shard
        line = one_error_line(proj.stage("trace_index", check=False))
        assert line == ("marin: error: data/trace_index: cannot write: no space left on device; the previous "
                        "version is left as it was and nothing half-written remains; free space (or fix the "
                        "disk) and rerun the stage")
        assert {k: v for k, v in proj.tree("data").items() if k != FILLER} == tree  # no temporary folder left
        log = proj.runs("trace_index")[-1]
        assert log[-1]["kind"] == "run.finished" and log[-1]["body"]["status"] == "failed"
        assert_no_torn_line(proj)
        ledger_kept(proj, before)


@pytest.mark.parametrize(("given", "default", "want"), [(None, 8, 8), (3, 8, 3), (1, 8, 1), (4096, 8, 4096),
                                                        (0, 8, None), (-2, 8, None), (4097, 8, None)])
def test_min_tokens_on_the_command_line_is_checked_as_params_yaml_is(given: int | None, default: int,
                                                                     want: int | None) -> None:
    from marin.trace import TraceRefused, chosen_min_tokens

    if want is None:
        with pytest.raises(TraceRefused, match="--min-tokens"):
            chosen_min_tokens(given, default)
    else:
        assert chosen_min_tokens(given, default) == want


def test_with_no_span_the_terminal_shows_the_longest_match() -> None:
    from marin.trace import render

    text = {"label": "", "tokens": 12, "covered": 0, "longest": 5, "longest_at": None, "spans": [],
            "longest_match": {"start": 3, "text": "the king and his"}}
    out = render({"index": "sha256:ab", "index_run": "trace-index-x", "trained_by": "train-x", "texts": [text]}, 8)
    assert "longest match, under 8 tokens: tokens 3-8 (5): 'the king and his'; `--min-tokens 5` traces it" in out
    spanned = {**text, "spans": [{"start": 0, "length": 9, "count": 1, "log10_unigram": -3.0, "text": "x",
                                  "documents": []}]}
    assert "longest match" not in render({"index": "a", "index_run": "b", "trained_by": "c", "texts": [spanned]}, 8)
