"""``marin lineage TARGET``: the runs and digests behind an artifact (resolved and walked by
:mod:`marin.ledger.query`) as an indented tree, or as W3C PROV-JSON (:mod:`marin.ledger.prov`)."""

from __future__ import annotations

from marin.ledger.prov import prov_json
from marin.ledger.query import Artifact, Step


def _short(digest: str) -> str:
    return f"sha256:{digest.split(':', 1)[-1][:12]}"


def _step_line(s: Step) -> str:
    commit = (s.code.get("git_commit") or "none")[:12] + ("+dirty" if s.code.get("dirty") else "")
    return f"{s.stage}  {s.run_id}  recipe {s.recipe_digest.split(':', 1)[-1][:12]}  commit {commit}  {s.status}"


def _artifact_line(a: Artifact) -> str:
    line = f"{_short(a.digest)}  {a.name}  {a.path}"
    if a.tensor_digest:
        line += f"  (folder digest; tensor digest {_short(a.tensor_digest)})"
    if a.locator or a.license:
        line += f"  raw archive from {a.locator or '?'}  license {a.license or '?'}"
    elif a.run is None:
        line += "  (no run in the ledger produced it)"
    return line


def render_text(node: Artifact | Step) -> str:
    """An indented tree: entity lines and run lines alternate down to the raw archives."""
    lines: list[str] = []
    seen: set[str] = set()

    def visit(n: Artifact | Step, lead: str, indent: str) -> None:
        kids: list[Artifact | Step] = []
        if isinstance(n, Artifact):
            lines.append(lead + _artifact_line(n))
            kids = [n.run] if n.run else []
        elif n.run_id in seen:
            lines.append(lead + _step_line(n) + "  (shown above)")
        else:
            seen.add(n.run_id)
            lines.append(lead + _step_line(n))
            if n is node:  # a run target: first say what it wrote
                lines.extend(f"  wrote {_artifact_line(o)}" for o in n.outputs)
            kids = list(n.inputs)
        for i, kid in enumerate(kids):
            last = i == len(kids) - 1
            visit(kid, indent + ("`-- " if last else "|-- "), indent + ("    " if last else "|   "))

    visit(node, "", "")
    return "\n".join(lines) + "\n"


def render(node: Artifact | Step, fmt: str) -> str:
    """The text ``marin lineage`` prints: the tree (``text``) or PROV-JSON (``prov-json``)."""
    return render_text(node) if fmt == "text" else prov_json(node)
