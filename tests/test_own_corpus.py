"""docs/guide/own-corpus.md, "Use your own corpus", followed literally: its commands, its snippet, its checks.

The commands and the YAML come from the walkthrough's fenced code blocks (the page up to its first
``## `` heading), so the test breaks when the guide drifts from what marin does.
"""

from __future__ import annotations

import json
import random
import re
import shlex
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import REPO, Project, make_text, new_project

PAGE = "docs/guide/own-corpus.md"
SECTION = "# Use your own corpus\n"


def _section() -> str:
    text = (REPO / PAGE).read_text()
    assert text.startswith(SECTION), f"{PAGE} does not open with {SECTION!r}"
    return text.split(SECTION, 1)[1].split("\n## ", 1)[0]


def _blocks() -> list[tuple[str, str]]:
    """(language, body) of every fenced code block of the section, in order."""
    return re.findall(r"^```(\w+)\n(.*?)^```$", _section(), flags=re.M | re.S)


def _commands(body: str) -> list[list[str]]:
    return [argv for line in body.splitlines() if (argv := shlex.split(line, comments=True))]


def _make_files(dest: Path, pattern: str, rng: random.Random) -> dict[str, str]:
    """The user's files that ``cp PATTERN corpus/`` copies: {document name: text} as curate names them."""
    docs = {}
    if pattern.endswith("*.txt"):
        for i in range(8):
            docs[f"text{i}.txt"] = make_text(rng, 12)
            (dest / f"text{i}.txt").write_text(docs[f"text{i}.txt"])
    elif pattern.endswith("*.jsonl"):
        with open(dest / "records.jsonl", "w") as f:
            for i in range(1, 17):  # one record = one document, named by its line
                docs[f"records.jsonl#{i}"] = make_text(rng, 10)
                f.write(json.dumps({"id": i, "text": docs[f"records.jsonl#{i}"]}) + "\n")
    else:
        pytest.fail(f"the guide copies {pattern!r}: the test makes only *.txt and *.jsonl files")
    return docs


def _run_pin_block(proj: Project, body: str) -> tuple[dict[str, str], str]:
    """Run the first block (make the corpus, pin it); return the documents and marin pin's output."""
    rng, docs, printed = random.Random(11), {}, ""
    for argv in _commands(body):
        if argv[:2] == ["mkdir", "-p"]:
            (proj.root / argv[2]).mkdir(parents=True, exist_ok=True)
        elif argv[0] == "cp":
            docs.update(_make_files(proj.root / argv[-1], argv[1], rng))
        elif argv[:3] == ["uv", "run", "marin"] and argv[3] == "pin":
            printed = proj.marin(*argv[3:], check=True).stdout
        else:
            pytest.fail(f"guide command the test does not know: {shlex.join(argv)}")
    assert printed, "the first block of the section runs no `marin pin`"
    return docs, printed


def _normalized(snippet: str) -> dict:
    data = yaml.safe_load(snippet)
    for src in data["fetch"]["sources"]:
        src["sha256"] = "<sha256>"
    return data


def _splice(params: str, snippet: str) -> str:
    """Replace params.yaml's lines from ``fetch:`` down to, not including, ``curate:``."""
    lines = params.splitlines(keepends=True)
    start = lines.index("fetch:\n")
    end = next(i for i, line in enumerate(lines) if line.startswith("curate:"))
    return "".join([*lines[:start], snippet, "\n", *lines[end:]])


@pytest.mark.slow
def test_readme_own_corpus_walkthrough(tmp_path: Path) -> None:
    blocks = _blocks()
    assert [lang for lang, _ in blocks] == ["bash", "yaml", "bash"], blocks
    proj = new_project(tmp_path / "proj")

    # 1. the corpus as the guide describes it, pinned with the guide's command
    docs, printed = _run_pin_block(proj, blocks[0][1])
    assert _normalized(printed) == _normalized(blocks[1][1])  # the guide shows what marin prints
    assert printed.splitlines()[0].startswith("# marin pin: local corpus: sha256:")
    assert blocks[1][1].splitlines()[0].startswith("# marin pin: local corpus: sha256:")

    # 2. the snippet replaces the fetch section; the license placeholder is set
    params = proj.root / "params.yaml"
    params.write_text(_splice(params.read_text(), printed.replace("license: NOASSERTION", "license: CC0-1.0")))
    assert proj.marin("params", "check").returncode == 0

    # 3. the guide's data-stage commands and checks
    commands = _commands(blocks[2][1])
    assert commands[-1] == ["uv", "run", "dvc", "repro"]  # the whole pipeline: too slow here
    for argv in commands[:-1]:
        assert argv[:2] == ["uv", "run"], argv
        p = proj.run(*argv[2:]) if argv[2] == "dvc" else proj.marin(*argv[3:])
        assert p.returncode == 0, f"{shlex.join(argv)}:\n{p.stdout}\n{p.stderr}"
        if argv[3:4] == ["lineage"]:
            assert "local:corpus" in p.stdout and "CC0-1.0" in p.stdout, p.stdout

    # 4. every file of the corpus became a curated document, unchanged
    curated = [pq.read_table(proj.root / f"data/curated/{s}.parquet").to_pylist() for s in ("train", "validation")]
    got = {r["name"]: r["text"] for rows in curated for r in rows}
    assert got == {name: text.strip() for name, text in docs.items()}
    assert {r["corpus"] for rows in curated for r in rows} == {"mine"}
    assert (proj.root / "data/tokens").is_dir()
    inputs = [r["body"] for r in proj.runs("fetch")[-1] if r["kind"] == "input"]
    pinned = re.search(r"sha256:[0-9a-f]{64}", printed.splitlines()[0]).group(0)
    assert [(i["name"], i["locator"], i["digest"]) for i in inputs] == [("mine", "local:corpus", pinned)]
