"""A lineage graph (:mod:`marin.ledger.query`) as a W3C PROV document: ``marin lineage
--format prov-json`` and a report's lineage.prov.json.

Entities are digests (``sha256:<hex>``, in the RFC 6920 ``nih:sha-256;`` namespace),
activities are runs (``marin:<run id>``) and agents are the builders that ran them: the code
(digest and git commit) on one machine (digest of its environment fingerprint).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from prov.model import PROV, ProvDocument, QualifiedName

from marin import hashing
from marin.ledger.query import Artifact, Step, upstream

NAMESPACES = {"marin": "urn:marin:", "sha256": "nih:sha-256;"}


def _attrs(**values: Any) -> dict[str, Any]:
    return {f"marin:{k}": v for k, v in values.items() if v is not None}


def _time(stamp: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(stamp) if stamp else None


def _builder(step: Step) -> tuple[str, dict[QualifiedName | str, Any]]:
    """The agent that ran a step: its code (digest, commit) on one machine (fingerprint digest)."""
    fingerprint = hashing.json_digest(step.env)
    code = {"code_digest": step.code.get("code_digest"), "git_commit": step.code.get("git_commit")}
    ident = hashing.json_digest({**code, "fingerprint": fingerprint}).split(":")[1][:12]
    attrs = {PROV["type"]: PROV["SoftwareAgent"], PROV["label"]: "marin",
             **_attrs(**code, fingerprint=fingerprint, python=step.env.get("python"),
                      platform=step.env.get("platform"))}
    return f"marin:builder-{ident}", attrs


def to_prov(node: Artifact | Step, *more: Step) -> ProvDocument:
    """A PROV document of the node, the runs ``more`` and everything upstream of them: used,
    wasGeneratedBy, wasAssociatedWith, and wasDerivedFrom (each output of a run from each of its inputs)."""
    doc = ProvDocument()
    for prefix, uri in NAMESPACES.items():
        doc.add_namespace(prefix, uri)
    steps = upstream(node, *more)
    entities: dict[str, dict[str, Any]] = {}
    leaves = [node] if isinstance(node, Artifact) else []
    for a in [a for s in steps for a in (*s.outputs, *s.inputs)] + leaves:  # producers' names first
        named: dict[Any, Any] = {PROV["label"]: a.name, **_attrs(name=a.name, path=a.path, size=a.size)}
        attrs = entities.setdefault(a.digest, named)
        attrs.update(_attrs(locator=a.locator, license=a.license, tensor_digest=a.tensor_digest))
    for digest, attrs in entities.items():
        doc.entity(digest, attrs)  # the digest `sha256:<hex>` is itself a qualified name
    agents: set[str] = set()
    for s in steps:
        act = doc.activity(f"marin:{s.run_id}", _time(s.started), _time(s.finished), _attrs(
            stage=s.stage, status=s.status, recipe_digest=s.recipe_digest,
            git_commit=s.code.get("git_commit"), dirty=s.code.get("dirty")))
        agent, attrs = _builder(s)
        if agent not in agents:
            agents.add(agent)
            doc.agent(agent, attrs)
        doc.wasAssociatedWith(act, agent)
        for a in s.inputs:
            doc.used(act, a.digest)
        for a in s.outputs:
            doc.wasGeneratedBy(a.digest, act)
        for out, inp in sorted({(o.digest, i.digest) for o in s.outputs for i in s.inputs if o.digest != i.digest}):
            doc.wasDerivedFrom(out, inp, act)
    return doc


def prov_json(node: Artifact | Step, *more: Step) -> str:
    """:func:`to_prov` as PROV-JSON text (``--format prov-json``, a report's lineage.prov.json)."""
    return (to_prov(node, *more).serialize(format="json", indent=2) or "") + "\n"
