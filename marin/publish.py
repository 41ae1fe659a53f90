"""``marin publish``: put what a stranger needs to check the runs where they can fetch it, and
record where each object lives.

Besides the git repository (code, params, ``dvc.lock``, the ledger), a checker needs:

- every DVC-cached output (data, model, report): ``dvc push`` to the project's DVC remote; each
  is recorded with the URL of its md5 object (the ``.dir`` listing, for a directory);
- the checkpoints of every train run behind a published model, which ``marin verify
  --segments`` replays from. Orbax writes timestamps and random names, so checkpoint files are
  not reproducible bytes: each file is stored by its own sha256 under
  ``<remote>/marin/sha256/<2 hex>/<62 hex>``, with a manifest (canonical JSON: run, step, tensor
  digest, every file's path, sha256 and size) stored the same way.

One ledger run of stage ``publish`` holds a ``publication`` record per object. Commit the
ledger and push the git repository after it: the records are how ``marin verify`` finds the
checkpoints on a machine that lacks them, fetched by digest and each file checked.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marin import fsutil, hashing
from marin.errors import IntegrityError, MarinError
from marin.ledger.index import Index, hash_cache, with_index
from marin.ledger.run import Plan, Run
from marin.ledger.store import RunLog, load_run

CACHE = Path(".marin/cache/checkpoints")  # fetched checkpoints (git-ignored), by train run id
MANIFEST = "marin.checkpoint-manifest@1"


class PublishError(MarinError):
    """Nothing or not everything could be published (no remote, a failed push, an unrecorded output)."""


@dataclass
class Remote:
    """A DVC remote as DVC itself opens it (URL, endpoint and credentials from DVC's config)."""

    name: str
    url: str
    fs: Any  # dvc_objects FileSystem
    base: str  # the remote's root inside ``fs``
    odb: Any  # DVC's md5 object store on the remote

    def object_path(self, digest: str) -> str:
        """Where marin keeps the object with this sha256."""
        hexd = digest.split(":", 1)[1]
        return self.fs.join(self.base, "marin", "sha256", hexd[:2], hexd[2:])

    def url_of(self, path: str) -> str:
        return self.fs.unstrip_protocol(path)

    def md5_url(self, md5: str) -> str:
        return self.url_of(self.odb.oid_to_path(md5))


def _repo(root: Path) -> Any:
    from dvc.repo import Repo

    try:
        return Repo(str(root))
    except Exception as e:  # not a DVC project, or an unreadable .dvc/config
        raise PublishError(f"{root}: DVC cannot open the project ({_line(e)}); run `dvc init` or fix "
                           ".dvc/config") from None


def _line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def default_remote(root: Path) -> tuple[str, str] | None:
    """(name, URL) of the project's default DVC remote, read from its DVC config; None without one."""
    try:
        with _repo(root) as repo:
            name = repo.config["core"].get("remote")
            return (name, repo.config["remote"][name]["url"]) if name else None
    except (PublishError, KeyError):
        return None


def open_remote(repo: Any, name: str | None) -> Remote:
    name = name or repo.config["core"].get("remote")
    if not name:
        raise PublishError("no DVC remote is configured: `dvc remote add -d NAME s3://BUCKET/PREFIX` (and "
                           "`dvc remote modify NAME endpointurl URL` for an S3 server other than AWS), commit "
                           ".dvc/config, then rerun")
    if name not in repo.config["remote"]:
        raise PublishError(f"DVC remote {name!r} is not configured here; `dvc remote list` shows the remotes")
    try:
        r = repo.cloud.get_remote(name)
    except Exception as e:
        raise PublishError(f"DVC remote {name}: {_line(e)}; check .dvc/config") from None
    return Remote(name, repo.config["remote"][name]["url"], r.fs, r.path, r.odb)


# -- the lab's side -------------------------------------------------------------------------------


@with_index
def publish(root: Path, remote_name: str | None = None, say: Callable[[str], None] = print, *,
            index: Index) -> str:
    """dvc push, the checkpoints behind each published model, and a ``publish`` run recording
    where each object lives. Returns the run id. ``index``: the command's ledger index."""
    from marin.lineage import Ledger

    with _repo(root) as repo:
        remote = open_remote(repo, remote_name)
        outs = sorted((o.def_path, o.hash_info.value) for o in repo.index.outs if o.use_cache and o.hash_info)
        if not outs:
            raise PublishError("dvc.lock names no cached output: run the pipeline (`dvc repro`) first")
        say(f"publish: DVC remote {remote.name} ({remote.url})")
        try:
            pushed = repo.push(remote=remote.name)
        except Exception as e:
            raise PublishError(f"dvc push to {remote.name} ({remote.url}) failed: {_line(e)}; check the remote's "
                               "URL, endpoint and credentials, then rerun") from None
        say(f"publish: dvc push uploaded {pushed} file(s)")
        index.refresh()
        ledger = Ledger(root, index)
        records, trains = [], {}
        for path, md5 in outs:
            body, producer = _dvc_publication(root, remote, ledger, path, md5)
            records.append(body)
            if producer.started.body["stage"] == "train":
                trains[producer.run_id] = producer
        for log in trains.values():
            records += _publish_checkpoints(root, remote, log, say)
    plan = Plan.make(root, "publish", params={"publish": {"remote": remote.name, "url": remote.url}}, inputs=[],
                     index=index)
    with Run.begin(plan) as run:
        for body in records:
            run.record("publication", body)
    say(f"publish: {len(records)} object(s) recorded in run {run.run_id}; now commit and push the ledger: "
        "git add ledger dvc.lock && git commit -m 'publish' && git push")
    return run.run_id


def _dvc_publication(root: Path, remote: Remote, ledger: Any, path: str, md5: str) -> tuple[dict[str, Any], RunLog]:
    d = hashing.digest_path(root / path, hash_cache(root, index=ledger.index))
    if d.dvc_md5 != md5:
        raise PublishError(f"{path}: the copy here (md5 {d.dvc_md5}) is not what dvc.lock records ({md5}); "
                           f"`dvc checkout {path}` or `dvc commit`, then rerun")
    found = [(log, b) for log, b in ledger.producers_of(d.digest) if log.status == "succeeded"]
    if not found:
        raise PublishError(f"{path}: no succeeded ledger run produced {d.digest}, so no one could check it; "
                           "run the stage that makes it (dvc repro), then rerun")
    log, out = found[-1]
    if not remote.fs.exists(remote.odb.oid_to_path(md5)):
        raise PublishError(f"{path}: dvc push left no object {remote.md5_url(md5)}; rerun `dvc push`")
    return {"what": "dvc", "name": out["name"], "path": path, "digest": d.digest, "size": d.size,
            "remote": remote.name, "url": remote.md5_url(md5), "dvc_md5": md5}, log


def _put(remote: Remote, digest: str, local: Path | None = None, data: bytes | None = None) -> None:
    """Upload one object under its sha256, unless the remote has it already."""
    dest = remote.object_path(digest)
    if remote.fs.exists(dest):
        return
    if local is not None:
        remote.fs.put_file(str(local), dest)
    else:
        with remote.fs.open(dest, "wb") as f:
            f.write(data)


def _publish_checkpoints(root: Path, remote: Remote, log: RunLog, say: Callable[[str], None]) -> list[dict[str, Any]]:
    out = []
    for rec in log.of_kind("checkpoint"):
        b = rec.body
        where = root / b["path"]
        if not where.is_dir():
            raise PublishError(f"{b['path']}: checkpoint {b['step']} of run {log.run_id} is not on this machine, "
                               "and `marin verify --segments` replays from it; publish from where it trained")
        files = [{"path": rel, "sha256": digest, "size": size} for rel, digest, size in hashing.dir_entries(where)]
        for f in files:
            _put(remote, f["sha256"], local=where / f["path"])
        manifest = hashing.canonical_json({"schema": MANIFEST, "run_id": log.run_id, "step": b["step"],
                                           "digest": b["digest"], "path": b["path"], "files": files})
        mdigest = hashing.bytes_digest(manifest)
        _put(remote, mdigest, data=manifest)
        out.append({"what": "checkpoint", "name": f"checkpoint:{b['step']}", "path": b["path"], "digest": b["digest"],
                    "size": sum(f["size"] for f in files), "remote": remote.name,
                    "url": remote.url_of(remote.object_path(mdigest)), "run_id": log.run_id, "step": b["step"],
                    "manifest": mdigest, "files": len(files)})
    say(f"publish: {len(out)} checkpoint(s) of {log.run_id} stored by digest")
    return out


# -- the checker's side ---------------------------------------------------------------------------


def publications(root: Path, what: str, index: Index | None = None) -> list[dict[str, Any]]:
    """Every publication record of kind ``what`` in the ledger, oldest first (``index``: the command's)."""
    with Index.using(root, index) as idx:
        rows = idx.runs("publish")
    out = []
    for row in rows:
        log = load_run(root, row.run_id, validate=False)
        out += [r.body for r in log.of_kind("publication") if r.body["what"] == what]
    return out


def checkpoints_dir(root: Path, log: RunLog, index: Index | None = None) -> Path:
    """The run's recorded checkpoints: the project's own folder, else the published ones fetched
    into ``.marin/cache/checkpoints/<run id>/`` (every file checked against its sha256)."""
    recs = log.of_kind("checkpoint")
    own = root / Path(recs[0].body["path"]).parent
    if own.is_dir():
        return own
    pubs = {p["step"]: p for p in publications(root, "checkpoint", index) if p["run_id"] == log.run_id}
    if not pubs:
        return own
    dest = root / CACHE / log.run_id
    with _repo(root) as repo:
        remotes: dict[str, Remote] = {}
        for rec in recs:
            pub = pubs.get(rec.body["step"])
            if pub is None or pub["digest"] != rec.body["digest"] or (dest / str(rec.body["step"])).is_dir():
                continue  # not published (verify names it missing), or fetched before
            if pub["remote"] not in remotes:
                remotes[pub["remote"]] = _remote_for(repo, pub)
            _fetch_checkpoint(remotes[pub["remote"]], pub, dest / str(rec.body["step"]))
    return dest


def _remote_for(repo: Any, pub: dict[str, Any]) -> Remote:
    try:
        return open_remote(repo, pub["remote"])
    except PublishError as e:
        raise PublishError(f"{pub['path']} was published to DVC remote {pub['remote']} ({pub['url']}): {e}") from None


def _fetch(remote: Remote, digest: str, dest: Path, what: str) -> None:
    """Download the object with this sha256 to ``dest``, and prove it has it."""
    src = remote.object_path(digest)
    try:
        remote.fs.get_file(src, str(dest))
    except Exception as e:
        raise PublishError(f"{what}: cannot fetch {remote.url_of(src)}: {_line(e)}") from None
    got = hashing.file_digest(dest)
    if got != digest:
        raise IntegrityError(f"{what}: the remote object {remote.url_of(src)} has sha256 {got}, not the published "
                             f"{digest}: the copy in DVC remote {remote.name} was changed")


def _fetch_checkpoint(remote: Remote, pub: dict[str, Any], dest: Path) -> None:
    where = f"published checkpoint {pub['step']} of run {pub['run_id']}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        _fetch(remote, pub["manifest"], Path(tmp) / "manifest.json", f"{where} (manifest)")
        manifest = json.loads((Path(tmp) / "manifest.json").read_text())
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


def remote_objects(root: Path, rec: dict[str, Any], changed: list[str]) -> str:
    """For an input whose copy differs from its record: the published remote objects that hold the
    differing files (so a changed object in the remote is named), or '' when it was not published."""
    pub = next((p for p in reversed(publications(root, "dvc")) if p["digest"] == rec["digest"]), None)
    if pub is None:
        return ""
    md5 = pub.get("dvc_md5", "")
    try:
        with _repo(root) as repo:
            remote = open_remote(repo, pub["remote"])
            if not md5.endswith(".dir"):
                return f"; published as {pub['url']}"
            listing = Path(repo.cache.local.path) / md5[:2] / md5[2:]
            by_path = {e["relpath"]: e["md5"] for e in json.loads(listing.read_text())}
    except (PublishError, OSError, ValueError, KeyError):
        return f"; published at {pub['url']}"
    named = [f"{rel} = {remote.md5_url(by_path[rel])}" for rel in changed if rel in by_path]
    return f"; the remote objects behind them (DVC remote {pub['remote']}): {', '.join(named[:5])}" if named else ""
