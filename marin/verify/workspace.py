"""The isolated workspace a recorded run is replayed in.

A git worktree at the recorded commit (never the user's checkout), its params.yaml
carrying the recorded params, its inputs restored by digest, and the environment of
the recorded determinism class: the XLA CPU thread count (``NPROC``), the XLA flags, the
device count (set from the restored params by the stage itself) and the allow-listed
variables the run recorded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from marin import hashing, readers
from marin.env import GitError, git, recorded_env_vars
from marin.errors import MarinError
from marin.ledger.bodies import InputBody, RunStarted
from marin.ledger.check import entry_changes
from marin.paths import ledger_dir

TAIL = 64 * 1024  # bytes of a replay's stdout and stderr kept, from their ends, for its messages


class CannotVerify(MarinError):
    """The run cannot be replayed here (no commit, uncommitted code, missing input, failed replay)."""

    exit_code = 4


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        both = isinstance(v, dict) and isinstance(out.get(k), dict)
        out[k] = deep_merge(out[k], cast(dict[str, Any], v)) if both else v
    return out


@dataclass
class Workspace:
    """A throwaway worktree of ``project`` at ``commit``; :meth:`close` removes it."""

    project: Path
    root: Path
    commit: str
    keep: bool = False
    restored: list[dict[str, str]] = field(default_factory=list)  # input name, digest, where it came from

    @classmethod
    def open(cls, project: Path, run_id: str, started: RunStarted, keep: bool = False) -> Workspace:
        code = started["code"]
        commit = code.get("git_commit")
        if not commit:
            raise CannotVerify(f"run {run_id} was recorded outside a git repository: its code cannot be restored")
        if code.get("dirty"):
            names = ", ".join(code.get("changed") or []) or f"diff digest {code['diff_digest']}"
            raise CannotVerify(
                f"run {run_id} was recorded with uncommitted changes to {names}; "
                "their content is not in the ledger, so its code cannot be restored. Commit changes before "
                "recording runs that others should verify")
        if git(project, "cat-file", "-e", f"{commit}^{{commit}}") is None:
            raise CannotVerify(f"run {run_id} was recorded at commit {commit[:12]}, which this repository does "
                               "not have; fetch it (git fetch) and retry")
        base = Path(tempfile.mkdtemp(prefix=f"marin-verify-{run_id}-"))
        ws = cls(project, base / "ws", commit, keep)
        try:
            git(project, "worktree", "add", "--detach", "--force", str(ws.root), commit, check=True, timeout=300)
        except GitError as e:
            raise CannotVerify(str(e)) from None
        try:
            shutil.rmtree(ledger_dir(ws.root), ignore_errors=True)  # the replay's ledger starts empty
            ledger_dir(ws.root).mkdir(parents=True)
            ws._restore_params(started["params"])
        except BaseException:
            ws.close()
            raise
        return ws

    def _restore_params(self, recorded: dict[str, Any]) -> None:
        """params.yaml at the commit, with every section the run recorded put back as recorded."""
        path = self.root / "params.yaml"
        base: dict[str, Any] | None = yaml.safe_load(  # a mapping, as params.yaml is
            readers.read_text(path, "params", CannotVerify)) if path.is_file() else {}
        path.write_text(yaml.safe_dump(deep_merge(base or {}, recorded), sort_keys=False))

    def restore_input(self, rec: InputBody, entries: list[dict[str, Any]] | None = None) -> str:
        """Put the input recorded by ``rec`` (an input record body) at its path in the workspace, from
        the first place that holds the recorded digest: the worktree itself (a git-tracked input at the
        recorded commit), the DVC cache, the project's DVC remote, the project's copy. ``entries``: the
        producing run's file list of a directory input, to name the files that differ."""
        dest, want = self.root / rec["path"], rec["digest"]
        tried: list[str] = []
        if dest.exists():
            got = hashing.path_digest(dest)
            if got == want:
                return self._restored(rec, f"git worktree at {self.commit[:12]}")
            tried.append(f"commit {self.commit[:12]} holds {rec['path']} as {got}")
        md5 = rec.get("dvc_md5")
        if md5:
            if self._from_dvc_cache(md5, dest) and hashing.path_digest(dest) == want:
                return self._restored(rec, f"DVC cache (md5 {md5})")
            _remove(dest)
            why = self._from_dvc_remote(md5, dest)
            if why is None and hashing.path_digest(dest) == want:
                return self._restored(rec, f"the DVC remote (md5 {md5})")
            _remove(dest)
            tried.append(f"neither the DVC cache nor its remote has md5 {md5} (remote: {why or 'other bytes'})")
        src = self.project / rec["path"]
        if src.exists():
            got = hashing.path_digest(src)
            if got == want:
                _copy(src, dest)
                return self._restored(rec, f"project copy at {rec['path']}")
            tried.append(f"{rec['path']} in the project hashes to {got}{_changed_files(self.project, rec, entries)}")
        else:
            tried.append(f"{rec['path']} is not in the project")
        raise InputUnavailable(rec, "; ".join(tried))

    def _restored(self, rec: InputBody, source: str) -> str:
        self.restored.append({"name": rec["name"], "digest": rec["digest"], "source": source})
        return source

    def _from_dvc_cache(self, md5: str, dest: Path) -> bool:
        cache = _dvc_cache(self.project)
        if cache is None:
            return False
        obj = cache / md5[:2] / md5[2:]
        if not obj.is_file():
            return False
        _remove(dest)
        if not md5.endswith(".dir"):
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(obj, dest)
            return True
        from marin.remote import dir_listing

        for entry in dir_listing(obj):
            f = cache / entry["md5"][:2] / entry["md5"][2:]
            if not f.is_file():
                return False
            (dest / entry["relpath"]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dest / entry["relpath"])
        return True

    def _from_dvc_remote(self, md5: str, dest: Path) -> str | None:
        """Fetch the object into the project's DVC cache from its default remote (as `dvc fetch`
        would, bounded by the ``network`` params), then restore it from there; None when restored,
        else why not (no remote, the remote lacks it, no answer)."""
        from marin.remote import fetch_md5

        cache = _dvc_cache(self.project, create=True)
        if cache is None:
            return "not a DVC project"
        why = fetch_md5(self.project, md5, cache)
        if why is None and not self._from_dvc_cache(md5, dest):
            return "fetched, but not complete in the cache"
        return why

    def env(self, started: RunStarted, forced_flags: list[str]) -> dict[str, str]:
        """The replay's environment: the verifier's, with the recorded determinism settings put back."""
        mine = recorded_env_vars()  # the verifier's own allow-listed variables: none of them carry over
        env = {k: v for k, v in os.environ.items() if k not in mine}
        recorded = recorded_env_vars(started["env"]["env_vars"])  # re-filtered: never PYTHONPATH, LD_PRELOAD...
        env.update({k: v for k, v in recorded.items() if not k.startswith("MARIN_")})
        det = started["determinism_class"]
        if det.get("kind") == "jax":
            flags, threads = det.get("xla_flags"), det.get("xla_cpu_threads")  # a jax class records both
            if flags is None or threads is None:
                raise CannotVerify("run.started's jax determinism class records no xla_flags or xla_cpu_threads "
                                   "(edited?); the replay cannot be given the settings it ran under")
            env["XLA_FLAGS"] = " ".join([*flags, *forced_flags])
            env["NPROC"] = str(threads)
        elif forced_flags:
            env["XLA_FLAGS"] = " ".join(forced_flags)
        env["MARIN_ROOT"] = str(self.root)
        env["MARIN_MLFLOW"] = "off"  # the replay is not a run of the project
        env["PYTHONPATH"] = os.pathsep.join([str(self.root), *filter(None, [env.get("PYTHONPATH")])])
        return env

    def run(self, argv: list[str], env: dict[str, str], what: str,
            cwd: Path | None = None, progress: bool = False) -> subprocess.CompletedProcess[str]:
        """``python ARGV`` in the workspace (``cwd``: elsewhere, for the verifier's own tools);
        ``progress``: the replay's stderr (its progress bars) is shown on ours as it comes."""
        if progress:
            p = _run_showing_stderr([sys.executable, *argv], cwd or self.root, env)
        else:
            p = _run_captured([sys.executable, *argv], cwd or self.root, env)
        if p.returncode != 0:
            tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-8:])
            raise CannotVerify(f"{what} failed (exit {p.returncode}) in {self.root}:\n{tail}")
        return p

    def close(self) -> None:
        if self.keep:
            print(f"verify: workspace kept at {self.root}")
            return
        git(self.project, "worktree", "remove", "--force", str(self.root), timeout=300)  # best effort
        shutil.rmtree(self.root.parent, ignore_errors=True)


def _run_showing_stderr(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``argv``; its stderr goes to ours as it comes and is kept (the last 64 KiB) for the error message."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        tail = b""
        while chunk := os.read(proc.stderr.fileno(), 65536):
            raw = getattr(sys.stderr, "buffer", None)
            raw.write(chunk) if raw is not None else sys.stderr.write(chunk.decode("utf-8", "replace"))
            sys.stderr.flush()
            tail = (tail + chunk)[-TAIL:]
        proc.stderr.close()
        code = proc.wait()
        return subprocess.CompletedProcess(argv, code, _tail(out), tail.decode("utf-8", "replace"))


def _run_captured(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with its stdout and stderr in temporary files, of which the last 64 KiB each are kept
    (a replay may print without end; its messages need only the tail)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        code = subprocess.run(argv, cwd=cwd, env=env, stdout=out, stderr=err).returncode
        return subprocess.CompletedProcess(argv, code, _tail(out), _tail(err))


def _tail(f: Any) -> str:
    """The last ``TAIL`` bytes of the open file ``f``, decoded."""
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - TAIL))
    return f.read(TAIL).decode("utf-8", "replace")


class InputUnavailable(MarinError):
    """No copy of a recorded input with its recorded digest could be found."""

    def __init__(self, rec: InputBody, tried: str):
        self.rec = rec
        super().__init__(f"input {rec['name']} ({rec['path']}): no copy with the recorded digest "
                         f"{rec['digest']}: {tried}")


def _changed_files(project: Path, rec: InputBody, entries: list[dict[str, Any]] | None) -> str:
    """For a directory input, name the files that differ from the producing run's entries, and the
    remote objects they came from when `marin publish` recorded them."""
    from marin.remote import remote_objects

    src = project / rec["path"]
    if not src.is_dir() or not entries:
        return remote_objects(project, rec, []) if src.is_file() else ""
    changed = [rel for rel, _, _ in entry_changes(src, entries)]
    if not changed:
        return ""
    return f" (files differing from the record: {', '.join(changed[:5])}{remote_objects(project, rec, changed)})"


def _dvc_cache(project: Path, create: bool = False) -> Path | None:
    """The md5 object directory of the project's DVC cache (DVC 3 layout), if any (``create``: made
    when absent, for a fetch)."""
    try:
        from dvc.repo import Repo  # pyright: ignore[reportMissingTypeStubs]

        with Repo(str(project)) as repo:
            path = Path(repo.cache.local.path)  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
    except Exception:  # not a DVC project, or DVC cannot open it: no cache to use
        return None
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path if path.is_dir() else None


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif p.exists() or p.is_symlink():
        p.unlink()


def _copy(src: Path, dest: Path) -> None:
    _remove(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dest)
    else:
        shutil.copyfile(src, dest)
