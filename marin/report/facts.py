"""Every fact a report states, each with the ledger record it came from.

A fact is a value plus its source: a run id, the record's seq and digest, and a JSON
pointer into the record, or into a recorded output file (a manifest) whose digest the
record holds. Derived numbers (tokens seen, FLOPs) name their formula (one of ``FORMULAS``)
and the facts they are computed from. Renderers only print facts; ``marin report verify``
reads each one again at exactly its source (``marin.report.check``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marin import hashing, readers, stages
from marin.errors import MarinError
from marin.evaluate import baselines
from marin.ledger.query import Ledger, Step, upstream
from marin.ledger.records import Record
from marin.ledger.store import RunLog
from marin.report import cited, harness_section, references_section


class ReportError(MarinError):
    """A report cannot be built or does not match the ledger."""


def resolve(doc: Any, pointer: str) -> Any:
    """RFC 6901 JSON pointer."""
    for part in pointer.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def _esc(key: str) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


# The formulas a derived fact may name, and how each is computed from its input values.
FORMULAS: dict[str, Callable[[list[Any]], Any]] = {
    "steps × batch_size × seq_len": math.prod,
    "6 × parameters × tokens seen": lambda xs: 6 * math.prod(xs),
    # inputs in pairs (wall time in s, cores or devices) of each run: the hours of compute they took
    "Σ wall_s × cores / 3600": lambda xs: _hours(xs),
    "tokens seen / training tokens": lambda xs: xs[0] / xs[1],  # epochs (marin/report/budget.py)
    "tokens seen / parameters": lambda xs: xs[0] / xs[1],
    baselines.MARK: baselines.mark_of, baselines.MARK_HIGHER: baselines.mark_higher,  # benchmarks' marks
    # the share of traced output tokens inside verbatim spans (marin/report/memorisation.py): covered, then totals
    "Σ tokens inside spans / Σ output tokens": lambda xs: _share(xs),
}


def _share(xs: list[Any]) -> float:
    half = len(xs) // 2
    total = sum(xs[half:])
    return sum(xs[:half]) / total if total else 0.0


def _hours(xs: list[Any]) -> float:
    """Σ wall × n / 3600 over pairs (wall seconds, n): n a count, or a list of core ids (its length)."""
    return sum(w * (len(n) if isinstance(n, list) else n) for w, n in zip(xs[::2], xs[1::2], strict=True)) / 3600

MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|&~])")


def md_escape(text: str) -> str:
    """Backslash-escape Markdown's special characters (a fact's text inside a link or a table)."""
    return MD_SPECIAL.sub(r"\\\1", text)


def fmt(value: Any) -> str:
    """How a value is printed: integers with separators, floats to 4 decimals (6 significant
    digits below 0.01), text on one line (line breaks as ⏎), everything else as is."""
    if isinstance(value, str):
        return value.replace("\n", " ⏎ ")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if value != 0 and abs(value) < 0.01:
        return f"{value:.6g}"
    return f"{value:,.4f}"


@dataclass
class Fact:
    id: str
    label: str
    value: Any
    source: dict[str, Any]

    @property
    def text(self) -> str:
        return fmt(self.value)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "label": self.label, "value": self.value, "text": self.text, "source": self.source}


@dataclass
class Facts:
    """The facts of one report, in the order they were cited (ids F1, F2, ...)."""

    root: Path
    items: dict[str, Fact] = field(default_factory=dict)

    def _add(self, label: str, value: Any, source: dict[str, Any]) -> Fact:
        f = Fact(f"F{len(self.items) + 1}", label, value, source)
        self.items[f.id] = f
        return f

    def cite(self, label: str, log: RunLog, rec: Record, pointer: str) -> Fact:
        """A value inside a ledger record (``pointer`` into the whole record, e.g. ``/body/step``)."""
        value = resolve(rec.to_dict(), pointer)
        return self._add(label, value, {"run_id": log.run_id, "seq": rec.seq, "record": rec.digest,
                                        "pointer": pointer})

    def cite_file(self, label: str, log: RunLog, rec: Record, doc: dict[str, Any], pointer: str) -> Fact:
        """A value inside a recorded output file (``rec`` is its output record)."""
        return self._add(label, resolve(doc, pointer), {
            "run_id": log.run_id, "seq": rec.seq, "record": rec.digest, "file": rec.body["path"],
            "file_digest": rec.body["digest"], "pointer": pointer})

    def cite_vsa(self, label: str, path: str, digest: str, statement: dict[str, Any], pointer: str) -> Fact:
        """A value inside the statement of a signed verification summary (verifications/...)."""
        return self._add(label, resolve(statement, pointer), {"vsa": path, "file_digest": digest, "pointer": pointer})

    def derive(self, label: str, formula: str, inputs: list[Fact]) -> Fact:
        """A value computed by one of ``FORMULAS`` from other facts."""
        value = FORMULAS[formula]([f.value for f in inputs])
        return self._add(label, value, {"formula": formula, "inputs": [f.id for f in inputs]})

    def to_dict(self) -> dict[str, Any]:
        return {k: f.to_dict() for k, f in self.items.items()}


def read_output_file(root: Path, rec: Record) -> dict[str, Any]:
    """A recorded JSON output (a manifest), checked against its recorded digest."""
    path = root / rec.body["path"]
    if not path.is_file():
        raise ReportError(f"{rec.body['path']}: recorded by {rec.run_id} seq {rec.seq} but missing; "
                          "run `dvc checkout` or `dvc repro`")
    got = hashing.file_digest(path)
    if got != rec.body["digest"]:
        raise ReportError(f"{rec.body['path']}: hashes to {got}, but {rec.run_id} seq {rec.seq} recorded "
                          f"{rec.body['digest']}; the report is built only from recorded outputs")
    return readers.read_json(path, "manifest", ReportError)


def _output(log: RunLog, name: str) -> Record:
    for r in log.of_kind("output"):
        if r.body["name"] == name:
            return r
    raise ReportError(f"run {log.run_id} recorded no output {name!r}")


def _one(steps: list[Step], stage: str) -> Step:
    found = [s for s in steps if s.stage == stage]
    if not found:
        raise ReportError(f"the model's lineage has no {stage} run; run the pipeline (dvc repro)")
    return found[-1]


def gather(root: Path, model: str = stages.MODEL, ledger: Ledger | None = None) -> tuple[Facts, dict[str, Any]]:
    """Facts about the model at ``model`` (a path, digest or train run id) and the report's structure."""
    root = Path(root)
    ledger = ledger or Ledger(root)
    target = ledger.resolve(model)
    node = ledger.node(target)
    if target.note:
        raise ReportError(f"{target.note}; the report describes recorded bytes only: restore the model "
                          "(dvc checkout) or name the train run")
    steps = upstream(node)
    for s in steps:
        if s.status != "succeeded":
            raise ReportError(f"run {s.run_id} ({s.stage}) in the model's lineage is {s.status}; a report "
                              "describes succeeded runs only")
    train = _one(steps, "train")
    for stage in ("fetch", "curate", "tokenize"):
        _one(steps, stage)
    logs = {s.stage: ledger.runs[s.run_id] for s in steps}
    digests = {o.digest for o in train.outputs}
    read = cited.readers(ledger, digests)  # evaluate, export, evaluate_instruct, export_instruct
    logs.update(read)
    f = Facts(root)
    # every run whose records the report cites, and everything upstream of them (evaluate's evalsets run; the sft
    # and instructions runs behind evaluate_instruct): the lineage, the compute and the verification tables
    behind = upstream(node, *(ledger._step(log.run_id) for log in read.values()))
    doc: dict[str, Any] = {"lineage": [{"stage": s.stage, "run_id": s.run_id, "status": s.status,
                                        "recipe_digest": s.recipe_digest, "git_commit": s.code.get("git_commit"),
                                        "started": s.started, "finished": s.finished}
                                       for s in behind]}
    doc["model"] = _model(f, logs["train"])
    doc["data"] = _data(f, root, logs)
    doc["training"] = _training(f, logs["train"], doc["model"])
    from marin.report import budget  # epochs and tokens per parameter, derived from the facts above

    doc["budget"] = budget.section(f, doc)
    doc["evaluation"] = _evaluation(f, logs["evaluate"]) if "evaluate" in logs else None
    doc["harness"] = harness_section.facts(f, logs["evaluate"]) if "evaluate" in logs else None
    doc["reference_models"] = references_section.facts(f, ledger, root)  # other models, on the same requests
    doc["export"] = _export(f, logs["export"]) if "export" in logs else None
    doc["environment"] = _environment(f, logs["train"])
    doc["environment"]["packages"].update(harness_section.package(doc["harness"]))  # lm-eval made numbers too
    doc["compute"] = _compute(f, [ledger.runs[r["run_id"]] for r in doc["lineage"]])
    doc["verification"] = _verification(f, ledger, [row["run_id"] for row in doc["lineage"]])
    return f, doc


def _model(f: Facts, log: RunLog) -> dict[str, Any]:
    s, out = log.start, _output(log, "model")
    p = "/body/params/model"
    arch = {k: f.cite(f"model.{k}", log, s, f"{p}/{_esc(k)}").id for k in s.body["params"]["model"]}
    return {"path": out.body["path"],
            "tensor_digest": f.cite("model tensor digest", log, out, "/body/tensor_digest").id,
            "folder_digest": f.cite("model folder digest", log, out, "/body/digest").id,
            "n_params": f.cite("parameters", log, out, "/body/meta/n_params").id,
            "steps": f.cite("optimizer steps", log, out, "/body/meta/step").id, "architecture": arch,
            "recipe_digest": f.cite("train recipe digest", log, s, "/body/recipe_digest").id}


def _data(f: Facts, root: Path, logs: dict[str, RunLog]) -> dict[str, Any]:
    fetch, curate, tokenize = logs["fetch"], logs["curate"], logs["tokenize"]
    sources = []
    for r in fetch.of_kind("input"):
        sources.append({"name": r.body["name"], "locator": f.cite(f"{r.body['name']} locator", fetch, r,
                                                                  "/body/locator").id,
                        "license": f.cite(f"{r.body['name']} license", fetch, r, "/body/license").id,
                        "digest": f.cite(f"{r.body['name']} archive digest", fetch, r, "/body/digest").id,
                        "bytes": f.cite(f"{r.body['name']} archive bytes", fetch, r, "/body/size").id})
    cm_rec = _output(curate, "curate_manifest")
    cm = read_output_file(root, cm_rec)
    funnel = []
    for corpus in sorted(cm["funnel"]["corpora"]):
        c = cm["funnel"]["corpora"][corpus]
        base = f"/funnel/corpora/{_esc(corpus)}"
        removed = {step: {"docs": f.cite_file(f"{corpus}: docs removed by {step}", curate, cm_rec, cm,
                                              f"{base}/removed/{_esc(step)}/docs").id,
                          "bytes": f.cite_file(f"{corpus}: bytes removed by {step}", curate, cm_rec, cm,
                                               f"{base}/removed/{_esc(step)}/bytes").id}
                   for step in sorted(c["removed"]) if c["removed"][step]["docs"]}
        funnel.append({"corpus": corpus,
                       "license": f.cite_file(f"{corpus} license", curate, cm_rec, cm, f"{base}/license").id,
                       "in_docs": f.cite_file(f"{corpus}: documents in", curate, cm_rec, cm, f"{base}/in/docs").id,
                       "in_bytes": f.cite_file(f"{corpus}: bytes in", curate, cm_rec, cm, f"{base}/in/bytes").id,
                       "kept_docs": f.cite_file(f"{corpus}: documents kept", curate, cm_rec, cm,
                                                f"{base}/kept/docs").id,
                       "kept_bytes": f.cite_file(f"{corpus}: bytes kept", curate, cm_rec, cm,
                                                 f"{base}/kept/bytes").id,
                       "kept_raw_bytes": f.cite_file(f"{corpus}: bytes kept, as read", curate, cm_rec, cm,
                                                     f"{base}/kept_raw/bytes").id if "kept_raw" in c else None,
                       "removed": removed})
    tm_rec = _output(tokenize, "tokenize_manifest")
    tm = read_output_file(root, tm_rec)
    splits = {}
    for split in sorted(tm["splits"]):
        sp, base = tm["splits"][split], f"/splits/{_esc(split)}"
        splits[split] = {
            "docs": f.cite_file(f"{split}: documents", tokenize, tm_rec, tm, f"{base}/docs").id,
            "tokens": f.cite_file(f"{split}: tokens", tokenize, tm_rec, tm, f"{base}/tokens").id,
            "bytes": f.cite_file(f"{split}: bytes", tokenize, tm_rec, tm, f"{base}/bytes").id,
            "corpora": {c: {k: f.cite_file(f"{split} {c}: {k}", tokenize, tm_rec, tm,
                                           f"{base}/corpora/{_esc(c)}/{k}").id for k in ("docs", "tokens", "bytes")}
                        for c in sorted(sp["corpora"])}}
    tok = {"vocab_size": f.cite_file("tokenizer vocabulary size", tokenize, tm_rec, tm, "/tokenizer/vocab_size").id,
           "type": f.cite_file("tokenizer type", tokenize, tm_rec, tm, "/tokenizer/type").id,
           "digest": f.cite_file("tokenizer digest", tokenize, tm_rec, tm, "/tokenizer/digest").id}
    return {"sources": sources, "funnel": funnel, "splits": splits, "tokenizer": tok,
            "curate_params": curate.start_body["params"].get("curate", {}),
            "license_notes": {src["name"]: src["license_note"]
                              for src in curate.start_body["params"].get("fetch", {}).get("sources", [])
                              if src.get("license_note")},
            "hub_datasets": [src["hub_dataset"]  # the cards' datasets: Hub ids only, none made up
                             for src in curate.start_body["params"].get("fetch", {}).get("sources", [])
                             if src.get("hub_dataset")],
            "extract": {src["name"]: [{k: e.get(k, []) for k in ("corpus", "include", "exclude")}
                                      for e in src.get("extract", [])]
                        for src in curate.start_body["params"].get("fetch", {}).get("sources", [])},
            "filters_source": {"run_id": curate.run_id, "seq": 0, "record": curate.start.digest}}


def _training(f: Facts, log: RunLog, model: dict[str, Any]) -> dict[str, Any]:
    s, fin = log.start, log.end
    hp = {k: f.cite(f"train.{k}", log, s, f"/body/params/train/{_esc(k)}").id for k in s.body["params"]["train"]}
    seeds = {"root": f.cite("root seed", log, s, "/body/seeds/root").id,
             "derivation": f.cite("seed derivation", log, s, "/body/seeds/derivation").id,
             "streams": {n: f.cite(f"seed stream {n} (fold_in)", log, s, f"/body/seeds/streams/{_esc(n)}/fold_in").id
                         for n in sorted(s.body["seeds"].get("streams", {}))}}
    items = f.items
    steps, batch = items[hp["steps"]], items[hp["batch_size"]]
    seq_len = f.cite("model.seq_len", log, s, "/body/params/model/seq_len")
    tokens = f.derive("tokens seen in training", "steps × batch_size × seq_len", [steps, batch, seq_len])
    n_params = items[model["n_params"]]
    flops = f.derive("training compute (FLOPs, 6·N·D estimate)", "6 × parameters × tokens seen", [n_params, tokens])
    metrics = log.of_kind("metric")
    curve = {"run_id": log.run_id, "records": [{"seq": r.seq, "digest": r.digest} for r in metrics],
             "step": [r.body["step"] for r in metrics],
             **{k: [r.body["values"][k]["value"] for r in metrics] for k in ("loss", "lr", "grad_norm")},
             "val_loss": [r.body["values"].get("val_loss", {}).get("value") for r in metrics]}
    last = metrics[-1] if metrics else None
    out = {"hyperparameters": hp, "seeds": seeds, "tokens_seen": tokens.id, "flops": flops.id, "curve": curve,
           "wall_s": f.cite("train wall time (s)", log, fin, "/body/wall_s").id,
           "checkpoints": len(log.bodies("checkpoint"))}
    if last is not None:
        out["final_loss"] = f.cite("final training loss", log, last, "/body/values/loss/value").id
        out["final_step"] = f.cite("final logged step", log, last, "/body/step").id
    return out


def _export(f: Facts, log: RunLog) -> dict[str, Any]:
    out = _output(log, "hf_model")
    return {"run_id": log.run_id, "path": out.body["path"],
            "digest": f.cite("Hugging Face export folder digest", log, out, "/body/digest").id,
            "tensor_digest": f.cite("Hugging Face export: tensor digest of the model it holds", log, out,
                                    "/body/tensor_digest").id}


def _compute(f: Facts, logs: list[RunLog]) -> dict[str, Any]:
    """CPU-hours (wall time × usable cores) of every run behind the report, and GPU-hours
    (wall time × devices) of the runs whose backend was a GPU."""
    cpu, gpu = [], []
    for log in logs:
        wall = f.cite(f"{log.start_body['stage']} wall time (s)", log, log.end, "/body/wall_s")
        cpu += [wall, f.cite(f"{log.start_body['stage']} usable cores", log, log.start,
                             "/body/env/usable_cores")]
        if log.start_body["determinism_class"].get("backend") in ("gpu", "cuda", "rocm"):
            gpu += [wall, f.cite(f"{log.start_body['stage']} devices", log, log.start,
                                 "/body/determinism_class/device_count")]
    return {"runs": len(logs),
            "cpu_hours": f.derive("CPU-hours (wall time × usable cores)", "Σ wall_s × cores / 3600", cpu).id,
            "gpu_hours": f.derive("GPU-hours (wall time × devices)", "Σ wall_s × cores / 3600", gpu).id
            if gpu else None}


def _environment(f: Facts, log: RunLog) -> dict[str, Any]:
    s = log.start
    env = {k: f.cite(f"env.{k}", log, s, f"/body/env/{k}").id
           for k in ("python", "platform", "cpu_model", "cpu_count", "machine")}
    env["cores_used"] = f.cite("usable cores", log, s, "/body/env/usable_cores").id
    det = {k: f.cite(f"determinism.{k}", log, s, f"/body/determinism_class/{_esc(k)}").id
           for k in ("profile", "isa_level", "backend", "device_kind", "device_count", "jax", "jaxlib",
                     "xla_cpu_threads", "xla_flags", "onednn_max_cpu_isa", "prng_impl")
           if s.body["determinism_class"].get(k) is not None}
    code = {k: f.cite(f"code.{k}", log, s, f"/body/code/{k}").id for k in ("git_commit", "code_digest", "lock_digest")}
    pkgs = {k: f.cite(f"package {k}", log, s, f"/body/env/packages/{_esc(k)}").id
            for k, v in sorted(s.body["env"]["packages"].items()) if v}
    return {"env": env, "determinism_class": det, "code": code, "packages": pkgs,
            "determinism_digest": f.cite("determinism class digest", log, s, "/body/determinism_digest").id}


def _evaluation(f: Facts, log: RunLog) -> dict[str, Any]:
    rows, samples = [], []
    for r in log.of_kind("eval"):
        if harness_section.from_harness(r.body):  # the harness's own table: marin.report.harness_section
            continue
        if r.body.get("samples"):
            samples = [{"prompt": f.cite("sample prompt", log, r, f"/body/samples/{i}/prompt").id,
                        "completion": f.cite("sample completion", log, r, f"/body/samples/{i}/completion").id}
                       for i in range(len(r.body["samples"]))]
            continue
        rows.append({"name": r.body["name"], "split": r.body["split"], "corpus": r.body.get("corpus", "all"),
                     **{k: f.cite(f"{r.body['name']} {r.body.get('corpus', 'all')} {k}", log, r,
                                  f"/body/values/{k}/value").id
                        for k in ("bits_per_byte", "perplexity")},
                     "tokens": f.cite(f"{r.body['name']} {r.body.get('corpus', 'all')} tokens", log, r,
                                      "/body/values/tokens").id})
    return {"run_id": log.run_id, "rows": rows, "samples": samples}


def _verification(f: Facts, ledger: Ledger, run_ids: list[str]) -> list[dict[str, Any]]:
    out = []
    for run_id in run_ids:
        log = ledger.runs[run_id]
        vs = log.of_kind("verification")
        if not vs:
            out.append({"run_id": run_id, "stage": log.start_body["stage"], "result": None})
            continue
        full = [v for v in vs if v.body["mode"] == "full"]
        v = (full or vs)[-1]  # a full replay says more than segments; the latest of the strongest kind
        row = {"run_id": run_id, "stage": log.start_body["stage"], "verifications": len(vs)}
        if v.body["mode"] == "segments":
            row["segments"] = {k: f.cite(f"segments {k}", log, v, f"/body/segments/{k}").id
                               for k in ("k", "n", "seed_source") if k in v.body["segments"]}
        out.append({**row,
                    "result": f.cite(f"verification of {run_id}", log, v, "/body/result").id,
                    "mode": f.cite("verification mode", log, v, "/body/mode").id,
                    "when": f.cite("verified at", log, v, "/time").id,
                    "where": f.cite("verifier CPU", log, v, "/body/verifier/env/cpu_model").id,
                    "cores": f.cite("verifier cores", log, v, "/body/verifier/env/usable_cores").id})
    return out
