"""The project's DVC remotes as the checker's side reads them: marin's objects stored by sha256
(``<remote>/marin/sha256/<2 hex>/<62 hex>``), the ``publication`` records of ``marin publish``,
and the published checkpoints of a train run fetched by digest (every file checked) for
``marin verify --segments`` on a machine that lacks them. Each fetch is bounded by the project's
``network`` params: at most ``max_bytes``, at least ``min_rate_bytes_s``, within ``total_timeout_s``
(:func:`_get_within`).
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marin import fsutil, hashing, net, readers
from marin.config import NetworkParams
from marin.errors import IntegrityError, MarinError
from marin.ledger.bodies import InputBody
from marin.ledger.index import Index
from marin.ledger.store import RunLog, load_run

CACHE = Path(".marin/cache/checkpoints")  # fetched checkpoints (git-ignored), by train run id
MANIFEST = "marin.checkpoint-manifest@1"
CHUNK = 1 << 20  # bytes a fetch reads at a time: the byte cap and a stop are seen between reads


class RemoteError(MarinError):
    """A DVC remote cannot be opened, or an object cannot be fetched from it."""


@dataclass
class Remote:
    """A DVC remote as DVC itself opens it (URL, endpoint and credentials from DVC's config)."""

    name: str
    url: str
    fs: Any  # dvc_objects FileSystem
    base: str  # the remote's root inside ``fs``
    odb: Any  # DVC's md5 object store on the remote
    bounds: NetworkParams = net.DEFAULT  # each fetch: network.max_bytes, min_rate_bytes_s and total_timeout_s

    def object_path(self, digest: str) -> str:
        """Where marin keeps the object with this sha256."""
        hexd = digest.split(":", 1)[1]
        return self.fs.join(self.base, "marin", "sha256", hexd[:2], hexd[2:])

    def url_of(self, path: str) -> str:
        return self.fs.unstrip_protocol(path)

    def md5_url(self, md5: str) -> str:
        return self.url_of(self.odb.oid_to_path(md5))


def open_repo(root: Path) -> Any:
    """The DVC project at ``root``, its remotes bounded by the project's ``network`` params."""
    from dvc.repo import Repo

    try:
        repo = Repo(str(root))
    except Exception as e:  # not a DVC project, or an unreadable .dvc/config
        raise RemoteError(f"{root}: DVC cannot open the project ({error_line(e)}); run `dvc init` or fix "
                           ".dvc/config") from None
    net.bound_dvc_remotes(repo.config, net.settings(root))
    return repo


def error_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def default_remote(root: Path) -> tuple[str, str] | None:
    """(name, URL) of the project's default DVC remote, read from its DVC config; None without one."""
    try:
        with open_repo(root) as repo:
            name = repo.config["core"].get("remote")
            return (name, repo.config["remote"][name]["url"]) if name else None
    except (RemoteError, KeyError):
        return None


def open_remote(repo: Any, name: str | None) -> Remote:
    name = name or repo.config["core"].get("remote")
    if not name:
        raise RemoteError("no DVC remote is configured: `dvc remote add -d NAME s3://BUCKET/PREFIX` (and "
                           "`dvc remote modify NAME endpointurl URL` for an S3 server other than AWS), commit "
                           ".dvc/config, then rerun")
    if name not in repo.config["remote"]:
        raise RemoteError(f"DVC remote {name!r} is not configured here; `dvc remote list` shows the remotes")
    try:
        r = repo.cloud.get_remote(name)
    except Exception as e:
        raise RemoteError(f"DVC remote {name}: {error_line(e)}; check .dvc/config") from None
    conf = repo.config["remote"][name]
    remote = Remote(name, conf["url"], r.fs, r.path, r.odb, net.settings(Path(repo.root_dir)))
    try:  # one bounded request first: a silent server is named here, not after a push's every file
        remote.fs.exists(remote.base)
    except Exception as e:
        where = f"{remote.url} (endpoint {conf['endpointurl']})" if conf.get("endpointurl") else remote.url
        raise RemoteError(f"DVC remote {name}: {where} did not answer ({error_line(e)}) within "
                          f"{net.bounds(net.settings(Path(repo.root_dir)))}; check the URL, the endpoint and the "
                          "credentials, or raise the bounds") from None
    return remote


def publications(root: Path, what: str, index: Index | None = None) -> list[dict[str, Any]]:
    """Every publication record of kind ``what`` in the ledger, oldest first (``index``: the command's)."""
    with Index.using(root, index) as idx:
        rows = idx.runs("publish")
    out = []
    for row in rows:
        log = load_run(root, row.run_id, validate=False)
        out += [p for p in log.bodies("publication") if p["what"] == what]
    return out


def checkpoints_dir(root: Path, log: RunLog, index: Index | None = None) -> Path:
    """The run's recorded checkpoints: the project's own folder, else the published ones fetched
    into ``.marin/cache/checkpoints/<run id>/`` (every file checked against its sha256)."""
    ckpts = log.bodies("checkpoint")
    own = root / Path(ckpts[0]["path"]).parent
    if own.is_dir():
        return own
    pubs = {p["step"]: p for p in publications(root, "checkpoint", index) if p["run_id"] == log.run_id}
    if not pubs:
        return own
    dest = root / CACHE / log.run_id
    with open_repo(root) as repo:
        remotes: dict[str, Remote] = {}
        for c in ckpts:
            pub = pubs.get(c["step"])
            if pub is None or pub["digest"] != c["digest"] or (dest / str(c["step"])).is_dir():
                continue  # not published (verify names it missing), or fetched before
            if pub["remote"] not in remotes:
                remotes[pub["remote"]] = _remote_for(repo, pub)
            fetch_checkpoint(remotes[pub["remote"]], pub, dest / str(c["step"]))
    return dest


def _remote_for(repo: Any, pub: dict[str, Any]) -> Remote:
    try:
        return open_remote(repo, pub["remote"])
    except RemoteError as e:
        raise RemoteError(f"{pub['path']} was published to DVC remote {pub['remote']} ({pub['url']}): {e}") from None


def _fetch(remote: Remote, digest: str, dest: Path, what: str) -> None:
    """Download the object with this sha256 to ``dest``, and prove it has it."""
    src = remote.object_path(digest)
    try:
        _get_within(remote, src, dest, what)
    except RemoteError:
        raise
    except Exception as e:
        raise RemoteError(f"{what}: cannot fetch {remote.url_of(src)}: {error_line(e)}") from None
    got = hashing.file_digest(dest)
    if got != digest:
        raise IntegrityError(f"{what}: the remote object {remote.url_of(src)} has sha256 {got}, not the published "
                             f"{digest}: the copy in DVC remote {remote.name} was changed")


def _get_within(remote: Remote, src: str, dest: Path, what: str) -> None:
    """``src`` into ``dest`` within ``remote.bounds``: at most ``max_bytes``, at least ``min_rate_bytes_s``
    over each ``min_rate_window_s``, and done within ``total_timeout_s``. The copy runs in a thread, as
    an fsspec read has no deadline of its own (a trickling server never times out a read; a fifo in a
    local remote never opens): past a bound the copy is told to stop, its thread is abandoned, and
    the fetch fails in one line."""
    t, url, outcome = remote.bounds, remote.url_of(src), []
    count = _counter(t, f"{what}: {url}")

    def copy() -> None:
        try:
            if remote.fs.protocol == "local":  # a read returns what the disk has
                with remote.fs.open(src, "rb") as f, open(dest, "wb") as out:
                    while chunk := f.read(CHUNK):
                        count.relative_update(len(chunk))
                        out.write(chunk)
            else:  # s3fs reads 50 MiB blocks (at 1 MB/s nothing for 50 s): its own copy counts each 64 KiB
                remote.fs.get_file(src, str(dest), callback=count)
            outcome.append(None)
        except BaseException as e:  # re-raised in the caller's thread
            outcome.append(e)

    worker = threading.Thread(target=copy, name=f"fetch {src}", daemon=True)
    end = time.monotonic() + t.total_timeout_s
    count.floor.start()
    worker.start()
    while worker.is_alive() and (left := end - time.monotonic()) > 0:
        if (rate := count.floor.check()) is not None:
            count.stopped = True
            raise RemoteError(f"{what}: {net.too_slow(url, rate, t)}")
        worker.join(min(net.TICK, left))
    if worker.is_alive():
        count.stopped = True
        raise RemoteError(f"{what}: {url} not fetched within network.total_timeout_s ({t.total_timeout_s:g} s); "
                          "check the remote, or raise network.total_timeout_s in params.yaml")
    if outcome and outcome[0] is not None:
        raise outcome[0]


def _counter(t: NetworkParams, where: str) -> Any:
    """An fsspec progress callback that bounds the copy it watches: each piece counted for the rate
    floor, the copy refused past ``max_bytes`` (a declared size at once), and ended once ``stopped``."""
    from fsspec.callbacks import Callback  # 140 ms: only when something is fetched

    class Counter(Callback):
        def __init__(self) -> None:
            super().__init__()
            self.floor, self.stopped = net.RateFloor(t), False

        def set_size(self, size: int | None) -> None:
            if size is not None and size > t.max_bytes:
                raise self.too_big()

        def relative_update(self, inc: int = 1) -> None:
            if self.stopped:
                raise RemoteError(f"{where}: stopped")
            self.floor.add(inc)
            if self.floor.got > t.max_bytes:
                raise self.too_big()

        def too_big(self) -> RemoteError:
            return RemoteError(f"{where} is more than network.max_bytes ({t.max_bytes} bytes); refusing it; raise "
                               "network.max_bytes in params.yaml if the object is that big")

    return Counter()


def put_object(remote: Remote, digest: str, local: Path | None = None, data: bytes | None = None) -> None:
    """Upload one object under its sha256, unless the remote has it already."""
    dest = remote.object_path(digest)
    if remote.fs.exists(dest):
        return
    if local is not None:
        remote.fs.put_file(str(local), dest)
    else:
        with remote.fs.open(dest, "wb") as f:
            f.write(data)


@dataclass(frozen=True)
class PutCheckpoint:
    manifest: str  # the manifest's sha256
    url: str  # where the manifest is
    files: int
    size: int


def put_checkpoint(remote: Remote, run_id: str, step: int, digest: str, path: str, where: Path) -> PutCheckpoint:
    """Store a checkpoint folder by digest: each file under its sha256, then the manifest (canonical
    JSON: run, step, tensor digest, every file's path, sha256 and size), last, so a manifest is only
    ever found with every file it names. ``path`` is the folder as the ledger names it."""
    files = [{"path": rel, "sha256": d, "size": size} for rel, d, size in hashing.dir_entries(where)]
    for f in files:
        put_object(remote, f["sha256"], local=where / f["path"])
    manifest = hashing.canonical_json({"schema": MANIFEST, "run_id": run_id, "step": step, "digest": digest,
                                       "path": path, "files": files})
    mdigest = hashing.bytes_digest(manifest)
    put_object(remote, mdigest, data=manifest)
    return PutCheckpoint(mdigest, remote.url_of(remote.object_path(mdigest)), len(files),
                         sum(f["size"] for f in files))


def fetch_checkpoint(remote: Remote, pub: dict[str, Any], dest: Path) -> None:
    """A checkpoint stored by :func:`put_checkpoint` (``pub``: run_id, step, digest, manifest, url) into
    ``dest``, every file checked against its sha256; ``dest`` appears whole or not at all."""
    where = f"published checkpoint {pub['step']} of run {pub['run_id']}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        _fetch(remote, pub["manifest"], Path(tmp) / "manifest.json", f"{where} (manifest)")
        manifest = readers.read_json(Path(tmp) / "manifest.json", "manifest", IntegrityError)
        if (manifest.get("schema"), manifest.get("digest"), manifest.get("step")) != (MANIFEST, pub["digest"],
                                                                                      pub["step"]):
            raise IntegrityError(f"{where}: the manifest at {pub['url']} is not the one of this checkpoint")
        with fsutil.atomic_dir(dest) as out:
            for f in manifest["files"]:
                target = out / f["path"]
                if ".." in Path(f["path"]).parts or os.path.isabs(f["path"]):
                    raise IntegrityError(f"{where}: the manifest names a path outside the checkpoint: {f['path']}")
                target.parent.mkdir(parents=True, exist_ok=True)
                _fetch(remote, f["sha256"], target, f"{where}, file {f['path']}")


def remote_objects(root: Path, rec: InputBody, changed: list[str]) -> str:
    """For an input whose copy differs from its record: the published remote objects that hold the
    differing files (so a changed object in the remote is named), or '' when it was not published."""
    pub = next((p for p in reversed(publications(root, "dvc")) if p["digest"] == rec["digest"]), None)
    if pub is None:
        return ""
    md5 = pub.get("dvc_md5", "")
    try:
        with open_repo(root) as repo:
            remote = open_remote(repo, pub["remote"])
            if not md5.endswith(".dir"):
                return f"; published as {pub['url']}"
            listing = Path(repo.cache.local.path) / md5[:2] / md5[2:]
            by_path = {e["relpath"]: e["md5"] for e in readers.read_json(listing, "dvc_dir")}
    except (RemoteError, OSError, ValueError, KeyError):
        return f"; published at {pub['url']}"
    named = [f"{rel} = {remote.md5_url(by_path[rel])}" for rel in changed if rel in by_path]
    return f"; the remote objects behind them (DVC remote {pub['remote']}): {', '.join(named[:5])}" if named else ""


MD5 = re.compile(r"[0-9a-f]{32}(\.dir)?")


def fetch_md5(root: Path, md5: str, cache: Path) -> str | None:
    """DVC's object with this md5 (for a ``.dir``: its listing and every file it names) fetched from
    the project's default remote into the md5 cache ``cache``, as `dvc fetch` would, each fetch
    bounded by the ``network`` params. None when done, else why not (no remote, not there, no answer)."""
    if default_remote(root) is None:
        return "no DVC remote is configured"
    try:
        with open_repo(root) as repo:
            remote = open_remote(repo, None)
            _get_md5(remote, md5, cache)
            if md5.endswith(".dir"):
                for entry in dir_listing(cache / md5[:2] / md5[2:]):
                    _get_md5(remote, entry["md5"], cache)
    except MarinError as e:
        return str(e)
    except Exception as e:  # the remote's own error (missing object, refused connection): said, not raised
        return error_line(e)
    return None


def dir_listing(path: Path) -> list[dict[str, str]]:
    """A DVC ``.dir`` object's listing, checked by shape: relative paths inside the directory, md5 ids."""
    listing = readers.read_json(path, "dvc_dir", IntegrityError)
    ok = isinstance(listing, list) and all(
        isinstance(e, dict) and isinstance(e.get("md5"), str) and MD5.fullmatch(e["md5"]) is not None
        and not e["md5"].endswith(".dir") and isinstance(e.get("relpath"), str) and e["relpath"]
        and not os.path.isabs(e["relpath"]) and ".." not in Path(e["relpath"]).parts for e in listing)
    if not ok:
        raise IntegrityError(f"{path}: not a DVC directory listing (a list of md5 and relpath, each path inside "
                             "the directory); remove it from the DVC cache and fetch it again")
    return listing


def _get_md5(remote: Remote, md5: str, cache: Path) -> None:
    """One md5 object into ``cache``, kept only when its bytes have that md5 (a listing is checked by shape)."""
    if MD5.fullmatch(md5) is None:
        raise IntegrityError(f"{md5!r} is not a DVC md5 object id")
    obj = cache / md5[:2] / md5[2:]
    if obj.is_file():
        return
    obj.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=obj.parent) as tmp:
        got = Path(tmp) / "object"
        _get_within(remote, remote.odb.oid_to_path(md5), got, f"DVC object {md5}")
        if md5.endswith(".dir"):
            dir_listing(got)
        elif hashing.file_digests(got)[1] != md5:
            raise IntegrityError(f"the DVC remote {remote.name}'s object {remote.md5_url(md5)} does not have md5 {md5}")
        os.replace(got, obj)

