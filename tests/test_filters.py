"""Quality filters: each rule removes the document built to fail it, and only that rule fires
first; statistics computed by hand for a small text."""

from __future__ import annotations

import dataclasses

import pytest

from marin import config
from marin.data import filters
from tests.conftest import REPO

SHIPPED = config.load(REPO / "params.yaml").curate.filters
WORDS = ("river", "stone", "garden", "window", "silver", "morning", "harbour", "lantern", "meadow", "thunder")


def lines(n: int, per_line: int = 6, start: int = 0) -> list[str]:
    """``n`` distinct lines of ordinary words."""
    return [" ".join(f"{WORDS[(i + j) % len(WORDS)]}{i}" if j == 0 else WORDS[(i * 3 + j) % len(WORDS)]
                     for j in range(per_line)) for i in range(start, start + n)]


CLEAN = "\n".join(lines(12))
CASES = {  # rule: (text, filters)
    "min_words": ("Too short to keep.", SHIPPED),
    "max_words": (CLEAN, dataclasses.replace(SHIPPED, max_words=60)),
    "mean_word_length": (" ".join(["ab", "cd", "ef"] * 30), SHIPPED),
    "symbol_word_ratio": (CLEAN + "\n" + " ".join(["#"] * 10), SHIPPED),
    "alpha_word_fraction": (CLEAN + "\n" + " ".join(str(1000 + i) for i in range(25)), SHIPPED),
    "bullet_lines": ("\n".join("- " + ln for ln in lines(12)), SHIPPED),
    "duplicate_lines": ("\n".join(lines(4) + ["the same line of words, said again"] * 6), SHIPPED),
    "duplicate_line_chars": ("\n".join(lines(10, 3) + [" ".join(WORDS * 4)] * 2), SHIPPED),
}


def test_every_rule_has_a_case() -> None:
    assert sorted(CASES) == sorted(name for name, _ in filters.RULES)


def test_a_clean_document_passes() -> None:
    assert filters.first_failure(filters.stats(CLEAN), SHIPPED) is None


@pytest.mark.parametrize("rule", sorted(CASES))
def test_each_rule_removes_its_document(rule: str) -> None:
    text, f = CASES[rule]
    failed = filters.first_failure(filters.stats(text), f)
    assert failed is not None and failed[0] == rule, failed
    assert failed[1]  # the explanation names the statistic and the bound


@pytest.mark.parametrize("rule", sorted(CASES))
def test_each_rule_alone_passes_the_clean_document(rule: str) -> None:
    fn = dict(filters.RULES)[rule]
    assert fn(filters.stats(CLEAN), SHIPPED) is None


def test_stats_by_hand() -> None:
    s = filters.stats("# one two\n* 3 four...\n# one two\n")
    assert s.words == 9  # '#' 'one' 'two' '*' '3' 'four...' '#' 'one' 'two'
    assert s.mean_word_length == pytest.approx(23 / 9)
    assert s.symbol_word_ratio == pytest.approx(3 / 9)  # '#' twice, '...' once
    assert s.alpha_word_fraction == pytest.approx(5 / 9)
    assert s.bullet_line_fraction == pytest.approx(1 / 3)  # '* 3 four...'
    assert s.duplicate_line_fraction == pytest.approx(2 / 3)
    assert s.duplicate_line_char_fraction == pytest.approx(18 / 29)


def test_rules_apply_in_order() -> None:
    # fails min_words and mean_word_length: the earlier rule is the reason
    assert filters.first_failure(filters.stats("a b c"), SHIPPED)[0] == "min_words"
