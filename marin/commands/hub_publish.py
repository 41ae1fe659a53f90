"""``marin publish --hf-folder OUT [--revisions]`` and ``marin publish --push REPO [--revisions] [--dry-run]``:
the export as the folder ``huggingface_hub.upload_folder`` sends (:mod:`marin.export.hub_folder`), the train
run's checkpoints as Hub revisions beside it (:mod:`marin.export.revisions`), and the push of all of them
(:mod:`marin.export.push`)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from marin import config
from marin.errors import MarinError
from marin.export import push
from marin.export.hub_folder import write_hub_folder


def _model_name(root: Path) -> str:
    report = config.load(root / "params.yaml").report
    return report.model_name if report else "marin-model"  # the export's name when params has no report


def _hub_repo(root: Path) -> str:
    """The Hub repository the export goes to: ``report.hub.repo_id``, else ``<your-name>/<model_name>``."""
    report = config.load(root / "params.yaml").report
    if report and report.hub and report.hub.repo_id:
        return report.hub.repo_id
    return f"<your-name>/{_model_name(root)}"


def _revisions(root: Path, out: Path, repo: str, quiet: bool = False) -> tuple[Path, list[dict[str, Any]]]:
    """The checkpoints behind the export as Hub revisions beside ``out``, and the commands that push them."""
    from marin.export.revisions import write_revisions

    report = config.load(root / "params.yaml").raw.get("report") or {"model_name": "marin-model", "license": "unknown"}
    dest, entries = write_revisions(root, out, report)
    print(f"wrote {dest}: {len(entries)} revisions (revisions.json: step, tensor digest, checkpoint)"
          + ("" if quiet else "; push each with:"))
    for e in [] if quiet else entries:
        print(f"hf upload {repo} {dest / e['revision']} . --revision {e['revision']}")
    return dest, entries


def hub_publish(args: argparse.Namespace) -> int:
    """``--hf-folder OUT [--revisions]``: the folders and the commands that push them; ``--push REPO``: pushed."""
    if args.push is not None:
        return _push(args)
    if args.dry_run:
        raise MarinError("--dry-run goes with --push REPO (what the push would send)")
    if args.hf_folder is not None:
        out = args.hf_folder if args.hf_folder.is_absolute() else Path.cwd() / args.hf_folder
        names, command = write_hub_folder(args.root, out, _hub_repo(args.root))
        print(f"wrote {out}: {len(names)} files, exactly what huggingface_hub.upload_folder sends; push it with:")
        print(command)
        if args.revisions:
            _revisions(args.root, out, command.split()[2])
        return 0
    raise MarinError("--revisions goes with --hf-folder OUT or --push REPO (the Hub folder whose revisions they are)")


def _push(args: argparse.Namespace) -> int:
    """``--push REPO``: the Hub folder (``--hf-folder``, else a temporary one) and its revisions, pushed."""
    with tempfile.TemporaryDirectory(prefix="marin-push-") as tmp:
        out = args.hf_folder or Path(tmp) / "hub"
        out = out if out.is_absolute() else Path.cwd() / out
        names, _ = write_hub_folder(args.root, out, args.push)
        print(f"wrote {out}: {len(names)} files, exactly what huggingface_hub.upload_folder sends")
        dest, entries = _revisions(args.root, out, args.push, quiet=True) if args.revisions else (out, [])
        push.push(push.plan(out, entries, dest), args.push, args.dry_run)
    return 0
