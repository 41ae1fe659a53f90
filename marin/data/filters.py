"""Quality filters in the style of Gopher (Rae et al. 2021, appendix A.1.1) and Dolma.

Each rule is a small function of a document's statistics; the first rule a document
fails is the reason it is removed, and the curation manifest counts it there.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from marin.config import Filters

_WORD = re.compile(r"\S+")
_ALPHA = re.compile(r"[^\W\d_]")
_BULLETS = ("•", "●", "○", "■", "□", "▪", "▫", "–", "-", "*")


@dataclass(frozen=True)
class Stats:
    words: int
    mean_word_length: float
    symbol_word_ratio: float
    alpha_word_fraction: float
    bullet_line_fraction: float
    duplicate_line_fraction: float
    duplicate_line_char_fraction: float


def stats(text: str) -> Stats:
    words = _WORD.findall(text)
    n = len(words)
    lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
    counts = Counter(lines)
    dup_lines = sum(c for c in counts.values() if c > 1)
    dup_chars = sum(len(ln) * c for ln, c in counts.items() if c > 1)
    line_chars = sum(len(ln) for ln in lines)
    symbols = text.count("#") + text.count("...") + text.count("…")
    return Stats(
        words=n,
        mean_word_length=sum(len(w) for w in words) / n if n else 0.0,
        symbol_word_ratio=symbols / n if n else 0.0,
        alpha_word_fraction=sum(1 for w in words if _ALPHA.search(w)) / n if n else 0.0,
        bullet_line_fraction=sum(1 for ln in lines if ln.startswith(_BULLETS)) / len(lines) if lines else 0.0,
        duplicate_line_fraction=dup_lines / len(lines) if lines else 0.0,
        duplicate_line_char_fraction=dup_chars / line_chars if line_chars else 0.0,
    )


Rule = Callable[[Stats, Filters], str | None]


def _too_short(s: Stats, f: Filters) -> str | None:
    return f"{s.words} words < {f.min_words}" if s.words < f.min_words else None


def _too_long(s: Stats, f: Filters) -> str | None:
    return f"{s.words} words > {f.max_words}" if s.words > f.max_words else None


def _word_length(s: Stats, f: Filters) -> str | None:
    if not f.min_mean_word_length <= s.mean_word_length <= f.max_mean_word_length:
        return (f"mean word length {s.mean_word_length:.2f} outside "
                f"[{f.min_mean_word_length}, {f.max_mean_word_length}]")
    return None


def _symbols(s: Stats, f: Filters) -> str | None:
    if s.symbol_word_ratio > f.max_symbol_word_ratio:
        return f"symbol/word ratio {s.symbol_word_ratio:.3f} > {f.max_symbol_word_ratio}"
    return None


def _alpha(s: Stats, f: Filters) -> str | None:
    if s.alpha_word_fraction < f.min_alpha_word_fraction:
        return f"alphabetic word fraction {s.alpha_word_fraction:.3f} < {f.min_alpha_word_fraction}"
    return None


def _bullets(s: Stats, f: Filters) -> str | None:
    if s.bullet_line_fraction > f.max_bullet_line_fraction:
        return f"bullet line fraction {s.bullet_line_fraction:.3f} > {f.max_bullet_line_fraction}"
    return None


def _dup_lines(s: Stats, f: Filters) -> str | None:
    if s.duplicate_line_fraction > f.max_duplicate_line_fraction:
        return f"duplicate line fraction {s.duplicate_line_fraction:.3f} > {f.max_duplicate_line_fraction}"
    return None


def _dup_line_chars(s: Stats, f: Filters) -> str | None:
    if s.duplicate_line_char_fraction > f.max_duplicate_line_char_fraction:
        return (f"duplicate line character fraction {s.duplicate_line_char_fraction:.3f} > "
                f"{f.max_duplicate_line_char_fraction}")
    return None


# (name in the manifest, rule), applied in this order.
RULES: tuple[tuple[str, Rule], ...] = (
    ("min_words", _too_short),
    ("max_words", _too_long),
    ("mean_word_length", _word_length),
    ("symbol_word_ratio", _symbols),
    ("alpha_word_fraction", _alpha),
    ("bullet_lines", _bullets),
    ("duplicate_lines", _dup_lines),
    ("duplicate_line_chars", _dup_line_chars),
)


def first_failure(s: Stats, f: Filters) -> tuple[str, str] | None:
    """(rule name, explanation) of the first rule the document fails, or None."""
    for name, rule in RULES:
        why = rule(s, f)
        if why is not None:
            return name, why
    return None
