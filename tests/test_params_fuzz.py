"""Hostile params.yaml, table-driven: every kind is refused by a real stage and by
``marin params check`` with exit 2 and one line naming the key or line, in under 2 s of
CPU and 200 MB, and leaves the ledger and data/ byte-identical.

CPU and peak RSS are the child's own, from ``os.wait4`` rusage. On Linux a child's
``ru_maxrss`` includes the high-water mark of the address space it was forked from
(exec records it), so a child forked from pytest would report pytest's size. Each child is
therefore forked by a tiny launcher (a bare ``python -I -S``, ~10 MB) that calls
``os.wait4`` on it; ``test_meter_sees_the_childs_own_usage`` shows the meter is honest.
Measured here: ``marin params check`` at most 0.64 s CPU and 49 MB, ``pipeline.tokenize``
(which imports pyarrow and tokenizers before it reads params) at most 0.67 s and 87 MB: both
fit the budget, so both carry every assertion.
"""

from __future__ import annotations

import codecs
import copy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import proc
from tests.conftest import BIN, Project, copy_project, env_for_subprocess

CPU_BUDGET_S = 2.0
RSS_BUDGET_KIB = 200 * 1024
COMMANDS = {
    "params-check": ("-m", "marin.cli", "params", "check"),
    "tokenize": ("-m", "pipeline.tokenize"),
}

CPU_CAP_S = 20  # a regression such as an alias bomb must not run for minutes


def measure(cwd: Path, *argv: str) -> proc.Child:
    """Run ``argv`` in ``cwd`` as a grandchild of the launcher (tests/proc.py); its own rusage."""
    return proc.measure(cwd, *argv, env=env_for_subprocess(), cpu_limit_s=CPU_CAP_S, timeout=120)


def test_meter_sees_the_childs_own_usage(tmp_path: Path) -> None:
    ballast = bytearray(300 << 20)  # this process grows; a child must not inherit the count
    ballast[:: 4096] = b"\x01" * len(ballast[:: 4096])
    small = measure(tmp_path, sys.executable, "-c", "pass")
    big = measure(tmp_path, sys.executable, "-c",
                  "b = bytearray(300 << 20); b[::4096] = b'x' * len(b[::4096])")
    busy = measure(tmp_path, sys.executable, "-c",
                   "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass")
    del ballast
    assert small.code == 0 and small.rss_kib < 50 * 1024, small
    assert big.rss_kib > 250 * 1024, big  # the meter would catch a child over budget
    assert busy.cpu_s >= 0.45, busy


# -- the cases: each makes params.yaml content from the good text and names what the line says

_DELETE = object()
Make = Callable[[str], tuple[str | bytes, tuple[str, ...]]]


def _lines(text: str) -> int:
    return text.count("\n")


def _line_of(text: str, needle: str) -> int:
    return _lines(text[: text.index(needle)]) + 1


def _shown(path: str) -> str:
    """``fetch.sources.0.name`` as the error names it: ``fetch.sources[0].name``."""
    out = ""
    for k in path.split("."):
        out += f"[{k}]" if k.isdigit() else (f".{k}" if out else k)
    return out


def setting(path: str, value: Any, *expect: str, at: str | None = None) -> Make:
    """Set (or delete) one value in the good params; the line names its key path (or ``at``)."""
    def make(good: str) -> tuple[str, tuple[str, ...]]:
        data = copy.deepcopy(yaml.safe_load(good))
        *parents, last = path.split(".")
        d = data
        for k in parents:
            d = d[int(k)] if k.isdigit() else d[k]
        key: Any = int(last) if last.isdigit() else last
        if value is _DELETE:
            del d[key]
        else:
            d[key] = value
        return yaml.safe_dump(data, sort_keys=False), ((_shown(path) if at is None else at) + ":", *expect)
    return make


def replaced(old: str, new: str | bytes, *expect: str) -> Make:
    """Replace text in the good file; ``{line}`` in ``expect`` is the line of ``old``."""
    def make(good: str) -> tuple[str | bytes, tuple[str, ...]]:
        assert old in good, old
        line = _line_of(good, old)
        if isinstance(new, bytes):
            return good.encode().replace(old.encode(), new, 1), tuple(e.format(line=line) for e in expect)
        return good.replace(old, new, 1), tuple(e.format(line=line) for e in expect)
    return make


def appended(extra: str, *expect: str) -> Make:
    """Add lines at the end; ``{line}`` in ``expect`` is the first added line."""
    return lambda good: (good + extra, tuple(e.format(line=_lines(good) + 1) for e in expect))


def whole(content: str | bytes | Callable[[str], str | bytes], *expect: str) -> Make:
    return lambda good: (content(good) if callable(content) else content, expect)


NAN, INF = float("nan"), float("inf")
PROMPTS = "  prompts:\n  - ROMEO.\n  - In the beginning\n  - Of Man's first disobedience\n"


def alias_bomb(good: str) -> str:
    """Nine nested anchors, each list nine references to the one before: 9**9 leaves."""
    levels = ["x: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"]
    for prev, cur in zip("abcdefgh", "bcdefghi", strict=True):
        levels.append(f"{cur}{cur}: &{cur} [{', '.join([f'*{prev}'] * 9)}]\n")
    assert PROMPTS in good
    return "".join(levels) + good.replace(PROMPTS, "  prompts: *i\n")


CASES: dict[str, Make] = {
    # numbers that are not finite, anywhere
    "nan": setting("train.lr", NAN, "nan is not a finite number"),
    "inf": setting("train.lr", INF, "inf is not a finite number"),
    "minus_inf": setting("train.eps", -INF, "-inf is not a finite number"),
    "inf_unbounded_field": setting("model.rope_theta", INF, "inf is not a finite number"),
    "float_overflow_literal": replaced("rope_theta: 10000.0", "rope_theta: 1.0e+400",
                                       "model.rope_theta: inf is not a finite number"),
    "nan_in_list": setting("evaluate.prompts.1", NAN, "nan is not a finite number"),
    "nan_in_report_section": setting("report.version", NAN, "nan is not a finite number"),
    "nan_deep_in_list": setting("fetch.sources.0.extract.0.include.0", NAN, "nan is not a finite number"),
    "nan_under_unknown_key": setting("train.not_a_key", NAN, "nan is not a finite number"),
    # integers: implausible, huge, of the wrong type
    "steps_1e15": setting("train.steps", 10**15, "1000000000000000 is out of range"),
    "int_10_pow_400": setting("train.steps", 10**400, "an integer of 401 characters is out of range"),
    "int_100000_digits": replaced("  steps: 400\n", f"  steps: {'9' * 100_000}\n",
                                  "train.steps: an integer of 100000 characters"),
    "yes_for_int": replaced("  steps: 400\n", "  steps: yes\n", "train.steps: true has the wrong type"),
    "bool_for_float": setting("train.lr", True, "true has the wrong type"),
    "float_for_int": setting("train.batch_size", 8.5, "8.5 has the wrong type"),
    "string_for_int": setting("model.d_model", "128", '"128" has the wrong type'),
    "negative_count": setting("tokenize.min_frequency", -1, "-1 is out of range"),
    "seed_above_uint32": setting("seed", 2**32, "4294967296 is out of range"),
    "d_model_huge": setting("model.d_model", 2**17, "131072 is out of range"),
    "seq_len_huge": setting("model.seq_len", 2**21, "is out of range"),
    "batch_huge": setting("train.batch_size", 2**21, "is out of range"),
    "shard_tokens_huge": setting("tokenize.shard_max_tokens", 10**12, "is out of range"),
    "num_perm_huge": setting("curate.dedup.near.num_perm", 10**6, "is out of range"),
    "log_every_huge": setting("train.log_every", 10**9, "is out of range"),
    "devices_huge": setting("runtime.devices", 10**6, "is out of range"),
    "sample_tokens_huge": setting("evaluate.sample_tokens", 10**6, "is out of range"),
    "max_words_huge": setting("curate.filters.max_words", 10**12, "is out of range"),
    "cross_field_heads": setting("model.n_heads", 3, "3 does not divide d_model (128)"),
    "cross_field_min_max": setting("curate.filters.min_words", 10**6, "is above max_words"),
    "cross_field_warmup": setting("train.warmup_steps", 400, "is not below train.steps"),
    # strings: control characters, sizes, path-like names, YAML types that are not strings
    "nul_escape_in_string": setting("curate.split.salt", "a\x00b", "control character U+0000"),
    "terminal_escape_in_prompt": setting("evaluate.prompts.0", "\x1b[31mred", "control character U+001B"),
    "raw_nul_byte": replaced("salt: marin-split-v1", "salt: marin\x00split",
                             "not valid YAML at line {line}: character U+0000"),
    "lone_surrogate": replaced("salt: marin-split-v1", 'salt: "\\ud800"', "not valid YAML at line {line}"),
    "string_too_long": setting("curate.split.salt", "s" * 5000, "5000 characters; at most 256 allowed"),
    "list_too_long": setting("evaluate.prompts", ["p"] * 2000, "2000 items; at most"),
    "string_for_list": setting("evaluate.prompts", "ROMEO.", "has the wrong type"),
    "empty_string": setting("curate.split.salt", ""),
    "source_name_dotdot": setting("fetch.sources.0.name", "../../etc", "is not allowed"),
    "corpus_name_path": setting("fetch.sources.0.extract.0.corpus", "a/../b", "is not allowed"),
    "model_name_slash": setting("report.model_name", "x/../../etc", "is not allowed"),
    "timestamp_for_string": replaced("version: '0.1'", "version: 2024-01-01",
                                     "report.version: '2024-01-01' reads as a YAML timestamp"),
    # keys: unknown and missing at every level, not strings, not names, duplicated
    "unknown_top_key": setting("trian", {"lr": 1}, "unknown key"),
    "unknown_nested_key": setting("curate.dedup.near.extra", 1, "unknown key"),
    "unknown_key_in_list_item": setting("fetch.sources.0.extract.0.extra", 1, "unknown key"),
    "missing_section": setting("fetch", _DELETE, "missing"),  # seed and fetch have no default (marin/defaults.yaml)
    "missing_nested_key": setting("fetch.sources.0.extract.0.format", _DELETE, "missing"),
    "missing_key_in_list_item": setting("fetch.sources.0.sha256", _DELETE, "missing"),
    "null_over_a_default": setting("report.version", None, "null has the wrong type"),
    "null_section": setting("fetch", None, "null has the wrong type"),
    "list_for_mapping": setting("curate.filters", [1, 2], "has the wrong type"),
    "empty_required_list": setting("fetch.sources", []),
    "int_key": appended("1: x\n", "<root>: '1' (a YAML int, not a string) as a key at line {line}"),
    "null_key": appended("null: x\n", "'null' (a YAML null, not a string) as a key at line {line}"),
    "bool_key": appended("yes: x\n", "'yes' (a YAML bool, not a string) as a key at line {line}"),
    "sequence_key": appended("[a]: x\n", "<root>: a sequence as a key at line {line}"),
    "merge_key": appended("<<: {seed: 1}\n", "'<<' (a YAML merge, not a string) as a key at line {line}"),
    "key_not_a_name": setting("train.Steps", 1, "key 'Steps' is not a params key", at="train"),
    "key_with_newline": setting("train.a\nb", 1, "key 'a\\nb' is not a params key", at="train"),
    "duplicate_top_key": appended("seed: 3\n", "seed: duplicate key 'seed' at line {line} (first at line 1)"),
    "duplicate_nested_key": replaced("  lr: 0.003\n", "  lr: 0.003\n  lr: 0.3\n",
                                     "train.lr: duplicate key 'lr'"),
    "duplicate_key_in_list_item": replaced("      format: text\n", "      format: text\n      format: jsonl\n",
                                           "fetch.sources[0].extract[0].format: duplicate key 'format'"),
    # the document as a whole
    "empty_file": whole("", "<root>: null has the wrong type"),
    "only_comments": whole("# nothing here\n", "<root>: null has the wrong type"),
    "list_root": whole("- seed\n- fetch\n", "<root>:", "has the wrong type"),
    "scalar_root": whole("just a string\n", "<root>:", "has the wrong type"),
    "not_yaml": whole("seed: [1,\n", "not valid YAML at line"),
    "tab_indent": replaced("  steps: 400\n", "\tsteps: 400\n", "not valid YAML at line {line}"),
    "two_documents": appended("---\nseed: 1\n", "line {line}, column 1: a second YAML document"),
    "latin1_byte": replaced("ROMEO.", "ROM\xc9O.".encode("latin-1"), "not UTF-8 at line {line}"),
    "utf8_bom": whole(lambda g: codecs.BOM_UTF8 + g.encode(), "starts with a byte order mark"),
    "utf16": whole(lambda g: g.encode("utf-16"), "not UTF-8 at line 1"),
    "oversized_file": appended("#" + "x" * (1 << 20) + "\n", "bytes is too large", "at most 1048576 bytes"),
    # YAML features params.yaml does not use, refused before anything is built
    "anchor": replaced("seed: 20251129", "seed: &s 20251129", "line {line}, column 7: YAML anchors and aliases"),
    "undefined_alias": appended("x: *nowhere\n", "line {line}, column 4: YAML anchors and aliases"),
    "alias_bomb": whole(alias_bomb, "line 1, column 4: YAML anchors and aliases"),
    "python_tag": replaced("seed: 20251129", "seed: !!python/object/apply:os.system ['true']",
                           "line {line}, column 7: YAML tag"),
    "local_tag": replaced("seed: 20251129", "seed: !local 1", "line {line}, column 7: YAML tag '!local'"),
    "deep_nesting": appended(f"deep: {'[' * 100}{']' * 100}\n", "line {line}", "nested more than 16 levels"),
    "too_many_nodes": appended(f"many: [{', '.join(['0'] * 20_000)}]\n", "line {line}",
                               "more than 10000 YAML nodes"),
}


# -- the harness -------------------------------------------------------------------------


def _state(proj: Project) -> dict[str, Any]:
    """What a refused stage must leave alone: the ledger, data/, and the set of files."""
    files = sorted(p.relative_to(proj.root).as_posix() for p in proj.root.rglob("*")
                   if p.is_file() and ".git" not in p.parts and "__pycache__" not in p.parts)
    return {"ledger": proj.tree("ledger"), "data": proj.tree("data"), "files": files}


class Bench:
    """One copy of the data project for the module. Each case rewrites its params.yaml and
    puts the good bytes back; a case that changed anything gets a fresh copy for the next one,
    so a failure cannot leak into the cases after it."""

    def __init__(self, source: Project, base: Path) -> None:
        self.source, self.base, self.copies = source, base, 0
        self.fresh()

    def fresh(self) -> None:
        self.copies += 1
        self.proj = copy_project(self.source, self.base / f"proj{self.copies}")
        self.good = (self.proj.root / "params.yaml").read_bytes()
        self.before = _state(self.proj)


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory, _data_project: Project) -> Bench:
    return Bench(_data_project, tmp_path_factory.mktemp("fuzz"))


def test_good_params_pass_within_budget(bench: Bench) -> None:
    r = measure(bench.proj.root, str(BIN / "python"), *COMMANDS["params-check"])
    assert r.code == 0 and r.stderr == "" and r.stdout.endswith("params.yaml: valid\n"), r
    assert r.cpu_s < CPU_BUDGET_S and r.rss_kib < RSS_BUDGET_KIB, r


def test_kinds_cover_the_brief() -> None:
    assert len(CASES) >= 40


@pytest.mark.parametrize("kind", list(CASES))
def test_hostile_params_refused(bench: Bench, kind: str) -> None:
    proj = bench.proj
    content, expect = CASES[kind](bench.good.decode())
    params = proj.root / "params.yaml"
    params.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
    try:
        results = {name: measure(proj.root, str(BIN / "python"), *argv)
                   for name, argv in COMMANDS.items()}
    finally:
        params.write_bytes(bench.good)
        after = _state(proj)
        if after != bench.before:
            bench.fresh()
    for name, r in results.items():
        assert r.code == 2, (name, r)
        assert r.stderr.count("\n") == 1 and r.stderr.endswith("\n"), (name, r.stderr)
        line = r.stderr.removesuffix("\n")
        assert line.startswith("marin: error: ") and "params.yaml: " in line, (name, line)
        for part in expect:
            assert part in line, (name, part, line)
        assert r.stdout == "", (name, r.stdout)
        assert r.cpu_s < CPU_BUDGET_S, (name, r.cpu_s)
        assert r.rss_kib < RSS_BUDGET_KIB, (name, r.rss_kib)
        print(f"{kind:28} {name:13} cpu {r.cpu_s:.2f} s  rss {r.rss_kib / 1024:.0f} MB")
    assert after == bench.before  # no ledger run, no output, no new file
