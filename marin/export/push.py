"""``marin publish --push REPO [--revisions] [--dry-run]``: the Hub folder (``--hf-folder``) and, with
``--revisions``, each checkpoint's revision folder, sent to the Hub repository ``REPO`` with
``huggingface_hub``: the folder to ``main``, each revision to a branch ``step<N>`` made from ``main`` (the way
Pythia and OLMo publish theirs), one ``upload_folder`` commit each, instead of one ``hf upload`` command per
revision. ``--dry-run`` prints what each push would send (the files, their bytes and, for a revision, its
tensor digest) and sends nothing. ``HF_ENDPOINT`` names another Hub (a mirror, a test server); ``HF_TOKEN``
or ``hf auth login`` the credentials, which marin never reads itself."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marin import hashing
from marin.errors import MarinError


class PushError(MarinError):
    """The Hub refused a push, or could not be reached."""


@dataclass(frozen=True)
class Push:
    """One folder for one revision of the repository."""

    revision: str
    folder: Path
    files: tuple[tuple[str, int], ...]  # (path in the repository, bytes), sorted
    note: str  # what it is: the export run's folder digest, or a checkpoint's step and tensor digest

    def line(self, repo: str, verb: str) -> str:
        size = sum(n for _, n in self.files)
        return (f"{verb} {repo}@{self.revision}: {len(self.files)} files, {size:,} bytes from {self.folder} "
                f"({self.note}): {', '.join(p for p, _ in self.files)}")


def plan(folder: Path, revisions: list[dict[str, Any]], revisions_dir: Path) -> list[Push]:
    """``folder`` to ``main``, then each revision entry (``revisions.json``) from its folder, in step order."""
    def one(rev: str, path: Path, note: str) -> Push:
        return Push(rev, path, tuple((p, n) for p, _, n in hashing.dir_entries(path)), note)

    out = [one("main", folder, f"folder {hashing.path_digest(folder)}")]
    for e in sorted(revisions, key=lambda e: int(e["step"])):
        out.append(one(e["revision"], revisions_dir / e["revision"],
                       f"step {e['step']}, tensor digest {e['tensor_digest']}"))
    return out


def push(pushes: list[Push], repo: str, dry_run: bool) -> list[str]:
    """Send each push (or, ``dry_run``, print it only); the commit ids the Hub gave, in order."""
    for p in pushes:
        print(p.line(repo, "would push" if dry_run else "pushing"))
    if dry_run:
        print(f"dry run: nothing sent; without --dry-run, {len(pushes)} commits go to {repo} "
              f"({_endpoint() or 'the Hugging Face Hub'})")
        return []
    from huggingface_hub import HfApi

    api, commits = HfApi(endpoint=_endpoint()), []
    try:
        api.create_repo(repo, exist_ok=True)
        for p in pushes:
            if p.revision != "main":  # made from main, as the Hub's branches are
                api.create_branch(repo, branch=p.revision, exist_ok=True)
            info = api.upload_folder(repo_id=repo, folder_path=p.folder, revision=p.revision,
                                     commit_message=f"marin publish: {p.revision} ({p.note})")
            commits.append(str(info.oid))
            print(f"pushed {repo}@{p.revision}: commit {info.oid}")
    except MarinError:
        raise
    except Exception as e:  # the Hub's refusal or the network's, in one line
        said = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise PushError(f"push to {repo} failed after {len(commits)} of {len(pushes)} commits ({type(e).__name__}: "
                        f"{said}); check the repository name, HF_TOKEN (`hf auth login`) and the network, then "
                        "push again: finished revisions are skipped by the Hub as unchanged") from None
    return commits


def _endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None
