"""Tracing text to the training documents it repeats (issue 43): stage trace_index's suffix arrays
against brute force, `marin trace` on a trained project (a copied passage found with its source and
licence, a passage found nowhere, one in two documents, one from the validation split only), its
refusal of an index built for another training run, and the index replayed bit-exact by `marin verify`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from marin.evaluate import sarray, trace_index
from tests.conftest import Project, copy_project


def _occurrences(docs: list[np.ndarray], pattern: np.ndarray) -> list[tuple[int, int]]:
    p = list(pattern)
    return [(d, j) for d, ids in enumerate(docs) for j in range(len(ids) - len(p) + 1) if list(ids[j:j + len(p)]) == p]


def _up_to_document_end(t: np.ndarray, i: int) -> list[int]:
    """Suffix i read up to its document's end, each SEP a symbol of its own (above every token, by position)."""
    out = []
    for j in range(i, len(t)):
        if t[j] == sarray.SEP:
            return [*out, (1 << 40) + j]
        out.append(int(t[j]))
    return out


def test_suffix_array_is_the_sorted_suffixes() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        t = rng.integers(0, 3, rng.integers(0, 50)).astype(np.int64)
        t[rng.random(len(t)) < 0.1] = sarray.SEP
        assert sarray.suffix_array(t).tolist() == sorted(range(len(t)), key=lambda i: _up_to_document_end(t, i))


@pytest.mark.parametrize("shard_tokens", [60, 10_000])
def test_spans_counts_and_places_agree_with_brute_force(tmp_path: Path, shard_tokens: int) -> None:
    rng = np.random.default_rng(shard_tokens)
    docs = [rng.integers(0, 5, rng.integers(0, 40)) for _ in range(60)]
    meta = trace_index.build((trace_index.Doc(f"d{i}", "c", "s", "L", d) for i, d in enumerate(docs)), tmp_path,
                             shard_tokens)
    assert (meta["documents"], meta["tokens"]) == (60, sum(map(len, docs)))
    assert (meta["shards"] > 5) == (shard_tokens == 60)
    index = trace_index.Index(tmp_path)
    for _ in range(60):
        q = rng.integers(0, 5, rng.integers(1, 30))
        longest = [max(n for n in range(len(q) - i + 1) if n == 0 or _occurrences(docs, q[i:i + n]))
                   for i in range(len(q))]
        want, reach = [], -1
        for i, n in enumerate(longest):  # maximal: not inside a span that starts earlier
            if i + n > reach and n >= 4:
                want.append((i, n))
            reach = max(reach, i + n)
        got = index.spans(q, 4)
        assert [(s.start, s.length) for s in got] == want
        for s in got:
            places = _occurrences(docs, q[s.start:s.start + s.length])
            assert s.count == len(places) and len(s.hits) == min(len(places), trace_index.MAX_DOCS)
            found = [index.locate(p) for p in s.hits]
            assert all((int(row["id"][1:]), at) in places for row, at in found)


def test_the_same_documents_give_the_same_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    docs = [trace_index.Doc(f"d{i}", "c", "s", "L", rng.integers(0, 50, 200)) for i in range(30)]
    trace_index.build(docs, tmp_path / "a", 1000)
    trace_index.build(docs, tmp_path / "b", 1000)
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert len(files) == 6 and json.loads((tmp_path / "a/index.json").read_text())["shards"] == 8  # 4 docs a shard
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)


def test_text_the_tokenizer_cannot_encode_is_one_line() -> None:
    from tokenizers import models, pre_tokenizers

    from marin.evaluate import tracing

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "the": 1, "king": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = None
    with pytest.raises(trace_index.TraceError) as e:
        tracing.encode(tok, "the queen")
    assert len(str(e.value).splitlines()) == 1 and "cannot encode" in str(e.value)


# -- on a trained project ----------------------------------------------------------------------




def _trace(proj: Project, *args: str) -> tuple[int, dict | str]:
    p = proj.marin("trace", *args, "--json")
    return p.returncode, json.loads(p.stdout) if p.returncode == 0 else p.stderr


def _token_docs(root: Path) -> tuple[list[str], list[np.ndarray]]:
    """Every indexed document's ids, read here without marin: the train shards, then the instruction
    train set encoded by the tokenizer."""
    ids, docs = [], []
    for shard in sorted((root / "data/tokens").glob("train-*.parquet")):
        t = pq.read_table(shard, columns=["doc_id", "tokens"])
        ids += t.column("doc_id").to_pylist()
        docs += [np.array(x, dtype=np.int64) for x in t.column("tokens").to_pylist()]
    tok = Tokenizer.from_file(str(root / "data/tokens/tokenizer.json"))
    lines = (root / "data/instructions/train.jsonl").read_text().splitlines()
    for n, line in enumerate(lines):
        text = "\n".join(m["content"] for m in json.loads(line)["messages"])
        ids.append(f"data/instructions/train.jsonl:{n + 1}")
        docs.append(np.array(tok.encode(text, add_special_tokens=False).ids, dtype=np.int64))
    return ids, docs


@pytest.mark.slow
def test_trace_names_the_documents_of_copied_passages_and_nothing_else(trained_project: Project) -> None:
    proj, root = trained_project, trained_project.root  # the session's project ran trace_index before evaluate
    tok = Tokenizer.from_file(str(root / "data/tokens/tokenizer.json"))
    ids, docs = _token_docs(root)
    train = pq.read_table(root / "data/curated/train.parquet").to_pylist()

    copied = "\n".join(train[2]["text"].split("\n")[3:6])  # three lines of one train document
    rc, got = _trace(proj, copied)
    assert rc == 0, got
    [span] = got["texts"][0]["spans"]
    n = len(tok.encode(copied).ids)
    assert (span["start"], span["length"], span["count"]) == (0, n, 1) and got["texts"][0]["covered"] == n
    [doc] = span["documents"]
    assert (doc["id"], doc["source"], doc["license"]) == (train[2]["doc_id"], "mini", "CC0-1.0")
    assert "\u00ab" + copied + "\u00bb" in doc["snippet"]
    assert ids.index(doc["id"]) == 2 and docs[2][doc["position"]:doc["position"] + n].tolist() == tok.encode(
        copied).ids

    rc, got = _trace(proj, "Zephyr quartz fjord lynx oxbow kiwi jigsaw vortex plinth mauve tundra gecko")
    assert rc == 0 and got["texts"][0]["spans"] == [] and got["texts"][0]["covered"] == 0

    twice = _in_two_documents(root, tok, ids, docs)
    rc, got = _trace(proj, twice)
    [span] = got["texts"][0]["spans"]
    assert span["count"] == 2 and len(span["documents"]) == 2
    want = {ids[d] for d, _ in _occurrences(docs, np.array(tok.encode(twice).ids))}
    assert {d["id"] for d in span["documents"]} == want and any(i.startswith("data/instructions") for i in want)

    validation = pq.read_table(root / "data/curated/validation.parquet").to_pylist()
    held_out = "\n".join(validation[0]["text"].split("\n")[1:4])
    rc, got = _trace(proj, held_out)
    assert rc == 0 and got["texts"][0]["spans"] == [], got
    # no span: the longest match is shown, and --min-tokens of its length traces it (issue 57, item 4)
    q, n = np.array(tok.encode(held_out).ids), got["texts"][0]["longest"]
    start = got["texts"][0]["longest_match"]["start"]
    assert 0 < n < 8 and _occurrences(docs, q[start:start + n]) and not _occurrences(docs, q[start:start + n + 1])
    rc, got = _trace(proj, held_out, "--min-tokens", str(n))
    assert rc == 0 and any(s["length"] == n and s["start"] == start for s in got["texts"][0]["spans"]), got

    [evaluate] = [r[0]["run_id"] for r in proj.runs("evaluate")]
    rc, got = _trace(proj, "--run", evaluate.rsplit("-", 1)[1])  # the 8-hex tail MLflow's run names show
    assert rc == 0 and [t["label"] for t in got["texts"]] == [f"greedy_samples #{i + 1}" for i in
                                                              range(len(proj.params["evaluate"]["prompts"]))]
    [index_run] = [r[0]["run_id"] for r in proj.runs("trace_index")]
    assert got["index_run"] == index_run
    recorded = json.loads((root / "evals/trace/samples.json").read_text())  # evaluate traced its samples too
    assert recorded["traced"] and [{k: v for k, v in t.items() if k != "prompt"} for t in
                                   recorded["sets"]["greedy_samples"]] == [
        {k: v for k, v in t.items() if k not in ("label", "longest_match")} for t in got["texts"]]
    p = proj.marin("verify", index_run)
    assert p.returncode == 0 and "BIT-EXACT" in p.stdout, p.stdout + p.stderr
    assert proj.marin("ledger", "check").returncode == 0

    from mlflow.tracking import MlflowClient  # the samples' trace is an artifact of the evaluate run

    assert proj.marin("mlflow", "sync").returncode == 0
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("marin").experiment_id],
                               f"tags.`marin.run_id` = '{evaluate}'")
    assert [a.path for a in client.list_artifacts(run.info.run_id, "trace")] == ["trace/samples.json"]
    got = Path(client.download_artifacts(run.info.run_id, "trace/samples.json", str(root / "dl")))
    assert got.read_bytes() == (root / "evals/trace/samples.json").read_bytes()


def _in_two_documents(root: Path, tok: Tokenizer, ids: list[str], docs: list[np.ndarray]) -> str:
    """The second half of a line, from its second word on, that a "continue this line" instruction
    example answers with, that its train document holds once and no other document holds."""
    for line in (root / "data/instructions/train.jsonl").read_text().splitlines():
        question, answer = (m["content"] for m in json.loads(line)["messages"][:2])
        if question.startswith("Continue this line: "):
            text = " " + " ".join(answer.split(" ")[1:])
            pattern = np.array(tok.encode(text).ids)
            if len(pattern) >= 8 and len(_occurrences(docs, pattern)) == 2:
                return text
    raise AssertionError("no instruction example answers with a line that one train document holds")


@pytest.mark.slow
def test_an_index_of_another_training_corpus_is_refused_naming_both_digests(trained_project: Project) -> None:
    proj = trained_project
    [train] = proj.runs("train")
    trained_on = next(r["body"]["digest"] for r in train if r["kind"] == "input" and r["body"]["name"] == "tokens")
    params = proj.params
    params["tokenize"]["shard_max_tokens"] = 3000  # another cut of the corpus: other token shards
    proj.write_params(params)
    proj.stage("tokenize")
    proj.stage("trace_index")
    run = proj.runs("trace_index")[-1]
    indexed = next(r["body"]["digest"] for r in run if r["kind"] == "input" and r["body"]["name"] == "tokens")
    assert indexed != trained_on
    p = proj.marin("trace", "the king")
    assert p.returncode == 1 and p.stdout == ""
    [line] = p.stderr.splitlines()
    assert indexed in line and trained_on in line and "models/final" in line, line


def _measured(docs: list[np.ndarray], ids: list[int], n: int) -> tuple[int, int]:
    """(the longest run of ``ids`` found verbatim in a document, the ids inside runs of at least ``n``), by
    sets of token tuples."""
    inside, longest = np.zeros(len(ids), dtype=bool), 0
    for k in range(1, len(ids) + 1):
        grams = {tuple(d[j:j + k].tolist()) for d in docs for j in range(len(d) - k + 1)}
        hits = [i for i in range(len(ids) - k + 1) if tuple(ids[i:i + k]) in grams]
        if not hits:
            break
        longest = k
        if k >= n:
            for i in hits:
                inside[i:i + k] = True
    return longest, int(inside.sum())


@pytest.mark.slow
def test_the_reports_memorisation_section_holds_the_measured_values_and_report_verify_names_an_edit(
        reported: tuple[Project, Path]) -> None:
    proj, out = reported
    root = proj.root
    report = json.loads((out / "report.json").read_text())
    facts, mem = report["facts"], report["doc"]["memorisation"]
    [evaluate] = proj.runs("evaluate")
    samples = next(r["body"]["samples"] for r in evaluate if r["kind"] == "eval"
                   and r["body"]["name"] == "greedy_samples")
    rows = [r for r in mem["rows"] if r["set"] == "greedy_samples"]
    assert len(rows) == len(samples) > 0
    _, docs = _token_docs(root)
    n = proj.params.get("trace", {}).get("min_tokens", 8)
    assert facts[mem["min_tokens"]]["value"] == n
    covered = tokens = 0
    for row, sample in zip(rows, samples, strict=True):
        longest, inside = _measured(docs, sample["token_ids"], n)
        assert facts[row["prompt"]]["value"] == sample["prompt"]
        assert (facts[row["longest"]]["value"], facts[row["covered"]]["value"]) == (longest, inside)
        assert facts[row["tokens"]]["value"] == len(sample["token_ids"])
        covered, tokens = covered + inside, tokens + len(sample["token_ids"])
        if longest >= n:
            assert row["documents"] and facts[row["documents"][0][1]]["value"] == "CC0-1.0"
    assert facts[mem["share"]]["value"] == pytest.approx(covered / tokens)
    md = (out / "report.md").read_text()
    section = md[md.index("## Memorisation"):]
    assert f"](#{mem['share']})" in section and f"](#{rows[0]['longest']})" in section

    ok = proj.marin("report", "verify", str(out))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    trace = root / "evals/trace/samples.json"
    data = json.loads(trace.read_text())
    data["sets"]["greedy_samples"][0]["covered"] += 1
    trace.write_text(json.dumps(data, ensure_ascii=False, indent=1, sort_keys=True) + "\n")
    r = proj.marin("report", "verify", str(out))
    assert r.returncode == 1 and f"{rows[0]['covered']} (greedy_samples covered)" in r.stderr, r.stderr


@pytest.mark.slow
def test_evaluate_instruct_traces_both_models_answers_against_the_instruct_models_training(
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    proj = copy_project(request.getfixturevalue("_sft_project"), tmp_path / "proj")  # sft ran, no index yet
    root = proj.root
    proj.stage("trace_index")
    proj.stage("evaluate_instruct")
    [run] = proj.runs("evaluate_instruct")[-1:]
    trace = json.loads((root / "evals/trace/instruct.json").read_text())
    answers = {r["body"]["name"]: r["body"]["samples"] for r in run if r["kind"] == "eval" and "samples" in r["body"]}
    assert trace["traced"] and set(trace["sets"]) == set(answers) == {"base_instructions", "instruct_instructions"}
    _, docs = _token_docs(root)
    for name, samples in answers.items():
        assert [t["tokens"] for t in trace["sets"][name]] == [len(s["token_ids"]) for s in samples]
        for t, s in list(zip(trace["sets"][name], samples, strict=True))[:3]:
            assert (t["longest"], t["covered"]) == _measured(docs, s["token_ids"], trace["min_tokens"])
    rc, got = _trace(proj, "--run", run[0]["run_id"])  # checked against the sft run's instruction set too
    assert rc == 0, got
    assert [t["spans"] for t in got["texts"]] == [t["spans"] for name in answers for t in trace["sets"][name]]
