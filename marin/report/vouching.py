"""What the report's verification section is judged against: the files under verifications/ as the
report read them, the lab's report key and the build time (:mod:`marin.report.verifications` judges them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from marin import hashing


@dataclass(frozen=True)
class Found:
    """One file under verifications/ as the report read it."""

    path: str  # project-relative
    data: bytes

    @property
    def digest(self) -> str:
        return hashing.bytes_digest(self.data)

    def to_dict(self) -> dict[str, Any]:
        return {"digest": self.digest, "size": len(self.data)}


Files = dict[str, Found]


@dataclass(frozen=True)
class Vouching:
    """What the section is judged against: the files under verifications/ the report reads, the key id
    of the lab's report key (None: unsigned), and the build time."""

    files: Files
    lab_key: str | None
    as_of: str
