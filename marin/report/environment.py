"""The report's "Environment and determinism class" section: the train run's machine, determinism
class, code and packages, each cited from its ``run.started`` record (lm-eval's version from the
evaluate run, when harness tasks ran; torch's from each reference model's run)."""

from __future__ import annotations

from typing import Any

from marin.report import harness_section
from marin.report.facts import Context, Facts, esc
from marin.report.page import Page, table

ENV = ("python", "platform", "cpu_model", "cpu_count", "machine")
DETERMINISM = ("profile", "isa_level", "backend", "device_kind", "device_count", "jax", "jaxlib", "xla_cpu_threads",
               "xla_flags", "onednn_max_cpu_isa", "prng_impl")


def facts(f: Facts, c: Context) -> dict[str, Any]:
    """Fact ids of the train run's environment, determinism class, code digests and packages."""
    log = c.logs["train"]
    s, started = log.start, log.start_body
    env = {k: f.cite(f"env.{k}", log, s, f"/body/env/{k}").id for k in ENV}
    env["cores_used"] = f.cite("usable cores", log, s, "/body/env/usable_cores").id
    det = {k: f.cite(f"determinism.{k}", log, s, f"/body/determinism_class/{esc(k)}").id
           for k in DETERMINISM if started["determinism_class"].get(k) is not None}
    code = {k: f.cite(f"code.{k}", log, s, f"/body/code/{k}").id for k in ("git_commit", "code_digest", "lock_digest")}
    pkgs = {k: f.cite(f"package {k}", log, s, f"/body/env/packages/{esc(k)}").id
            for k, v in sorted(started["env"]["packages"].items()) if v}
    pkgs.update(harness_section.package(c.doc["harness"]))  # lm-eval made numbers too
    refs: list[dict[str, Any]] = c.doc.get("reference_models") or []
    pkgs.update({f"torch (reference_{r['name']} run)": str(r["torch"])  # torch made the reference models' numbers
                 for r in refs if r.get("torch")})
    return {"env": env, "determinism_class": det, "code": code, "packages": pkgs,
            "determinism_digest": f.cite("determinism class digest", log, s, "/body/determinism_digest").id}


def lines(p: Page) -> list[str]:
    e, v = p.doc["environment"], p.v
    return ["## Environment and determinism class", "",
            *table(["", "value"], [[k, v(fid)] for k, fid in
                                   {**e["env"], **e["determinism_class"], **e["code"]}.items()]
                   + [["determinism class digest", v(e["determinism_digest"])],
                      ["packages", ", ".join(f"{k} {v(fid)}" for k, fid in e["packages"].items())]])]
