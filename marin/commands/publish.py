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
checkpoints on a machine that lacks them, fetched by digest and each file checked
(:mod:`marin.remote`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from marin import hashing
from marin.errors import MarinError
from marin.ledger.bodies import PublicationBody
from marin.ledger.index import Index, with_index
from marin.ledger.query import Ledger
from marin.ledger.run import Plan, Recipe, Run
from marin.ledger.store import RunLog
from marin.remote import Remote, error_line, open_remote, open_repo, put_checkpoint
from marin.stages import SOURCE_STAGES, TRAINING, code_files


class PublishError(MarinError):
    """Nothing or not everything could be published (no remote, a failed push, an unrecorded output)."""


@with_index
def publish(root: Path, remote_name: str | None = None, say: Callable[[str], None] = print, *,
            index: Index) -> str:
    """dvc push, the checkpoints behind each published model, and a ``publish`` run recording
    where each object lives. Returns the run id. ``index``: the command's ledger index."""
    with open_repo(root) as repo:
        remote = open_remote(repo, remote_name)
        outs = sorted((o.def_path, o.hash_info.value) for o in repo.index.outs if o.use_cache and o.hash_info)
        if not outs:
            raise PublishError("dvc.lock names no cached output: run the pipeline (`dvc repro`) first")
        say(f"publish: DVC remote {remote.name} ({remote.url})")
        try:
            pushed = repo.push(remote=remote.name)
        except Exception as e:
            raise PublishError(f"dvc push to {remote.name} ({remote.url}) failed: {error_line(e)}; check the remote's "
                               "URL, endpoint and credentials, then rerun") from None
        say(f"publish: dvc push uploaded {pushed} file(s)")
        index.refresh()
        ledger = Ledger(root, index, sources=SOURCE_STAGES)
        records: list[PublicationBody] = []
        trains: dict[str, RunLog] = {}
        for path, md5 in outs:
            body, producer = _dvc_publication(root, remote, ledger, path, md5)
            records.append(body)
            if producer.stage in TRAINING:  # its checkpoints are published too
                trains[producer.run_id] = producer
        for log in trains.values():
            records += _publish_checkpoints(root, remote, log, say)
    recorded = {"publish": {"remote": remote.name, "url": remote.url}}
    plan = Plan.make(root, Recipe("publish", recorded, closure=code_files(root, "publish")), index)
    with Run.begin(plan) as run:
        for body in records:
            run.record("publication", body)
    say(f"publish: {len(records)} object(s) recorded in run {run.run_id}; now commit and push the ledger: "
        "git add ledger dvc.lock && git commit -m 'publish' && git push")
    return run.run_id


def _dvc_publication(root: Path, remote: Remote, ledger: Ledger, path: str, md5: str) -> tuple[PublicationBody, RunLog]:
    d = hashing.digest_path(root / path, ledger.hashes)
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


def _publish_checkpoints(root: Path, remote: Remote, log: RunLog, say: Callable[[str], None]) -> list[PublicationBody]:
    out: list[PublicationBody] = []
    for b in log.bodies("checkpoint"):
        where = root / b["path"]
        if not where.is_dir():
            raise PublishError(f"{b['path']}: checkpoint {b['step']} of run {log.run_id} is not on this machine, "
                               "and `marin verify --segments` replays from it; publish from where it trained")
        put = put_checkpoint(remote, log.run_id, b["step"], b["digest"], b["path"], where)
        out.append({"what": "checkpoint", "name": f"checkpoint:{b['step']}", "path": b["path"], "digest": b["digest"],
                    "size": put.size, "remote": remote.name, "url": put.url, "run_id": log.run_id, "step": b["step"],
                    "manifest": put.manifest, "files": put.files})
    say(f"publish: {len(out)} checkpoint(s) of {log.run_id} stored by digest")
    return out
