"""The Foundation Model Transparency Index (Stanford CRFM) indicators this pipeline can
disclose from its records, in the shape of the FMTI per-developer report: indicator,
disclosure, evidence (ledger references ``run_id#seq``). Indicators the records cannot
fill are listed as not disclosed; the indicator list itself is a reference file (the vendored
Dec 2025 list by default, see marin/report/reference/README.md).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from marin import readers
from marin.data.sources import LOCAL_KINDS
from marin.export import energy
from marin.report import compute
from marin.report.cards import NR, Ctx, verification
from marin.report.facts import ReportError

NOT_DISCLOSED = "not disclosed: not in the pipeline's records"
FMTI_COLUMNS = ("domain", "subdomain", "indicator", "disclosed", "disclosure", "evidence")

Disclose = Callable[[Ctx], tuple[str, list[str]] | None]


def _data_size(c: Ctx) -> tuple[str, list[str]]:
    sp = c.doc["data"]["splits"]
    ids = [v[k] for v in sp.values() for k in ("docs", "tokens", "bytes")]
    return "; ".join(f"{n}: {c.t(v['docs'])} documents, {c.t(v['tokens'])} tokens, {c.t(v['bytes'])} bytes "
                     "of text" for n, v in sp.items()), ids


def _data_sources(c: Ctx) -> tuple[str, list[str]]:
    ss = c.doc["data"]["sources"]
    return "; ".join(f"{s['name']}: fetched from {c.t(s['locator'])}, licence {c.t(s['license'])}, archive "
                     f"{c.t(s['digest'])} ({c.t(s['bytes'])} bytes)" for s in ss), \
        [s[k] for s in ss for k in ("locator", "license", "digest", "bytes")]


def _curation(c: Ctx) -> tuple[str, list[str]]:
    parts: list[str] = []
    ids: list[str] = []
    for f in c.doc["data"]["funnel"]:
        removed = ", ".join(f"{step} {c.t(r['docs'])} documents/{c.t(r['bytes'])} bytes"
                            for step, r in f["removed"].items()) or "none"
        parts.append(f"{f['corpus']}: {c.t(f['in_docs'])} documents ({c.t(f['in_bytes'])} bytes) in; removed: "
                     f"{removed}; kept {c.t(f['kept_docs'])} ({c.t(f['kept_bytes'])} bytes stored, stripped and "
                     f"normalized" + (f"; {c.t(f['kept_raw_bytes'])} as read)" if f.get("kept_raw_bytes") else ")"))
        ids += [f[k] for k in ("in_docs", "in_bytes", "kept_docs", "kept_bytes", "kept_raw_bytes") if f.get(k)]
        ids += [r[k] for r in f["removed"].values() for k in ("docs", "bytes")]
    return "quality filters and exact/near deduplication per corpus: " + "; ".join(parts), ids


def _techniques(c: Ctx) -> tuple[str, list[str]]:
    text, ids = _curation(c)
    fs = c.doc["data"]["filters_source"]
    names = ", ".join(c.doc["data"]["curate_params"].get("filters", {})) or NR
    return (f"filters {names}; thresholds, normalisation and dedup settings in the curate run's parameters "
            f"(/body/params/curate of {fs['run_id']}#{fs['seq']}). {text}", [*ids, f"{fs['run_id']}#{fs['seq']}"])


def _data_license(c: Ctx) -> tuple[str, list[str]]:
    d = c.doc["data"]
    return "; ".join([f"source {s['name']}: {c.t(s['license'])}" for s in d["sources"]]
                     + [f"corpus {f['corpus']}: {c.t(f['license'])}" for f in d["funnel"]]), \
        [s["license"] for s in d["sources"]] + [f["license"] for f in d["funnel"]]


def _domains(c: Ctx) -> tuple[str, list[str]]:
    tr = c.doc["data"]["splits"]["train"]["corpora"]
    return "training split by corpus: " + "; ".join(
        f"{n}: {c.t(v['docs'])} documents, {c.t(v['tokens'])} tokens" for n, v in tr.items()), \
        [v[k] for v in tr.values() for k in ("docs", "tokens")]


def _replicability(c: Ctx) -> tuple[str, list[str]]:
    text, ids = _data_sources(c)
    checks = [f"{v['stage']} {c.t(v['result'])}" for v in c.doc["verification"]
              if v["stage"] in ("fetch", "curate", "tokenize") and v["result"]]
    ids += [v["result"] for v in c.doc["verification"] if v["stage"] in ("fetch", "curate", "tokenize")
            and v["result"]]
    return (f"{text}; curation and tokenization are recorded ledger runs that re-run from these archives"
            + (f" (verification: {', '.join(checks)})" if checks else "")), ids


def _measured(c: Ctx) -> tuple[str, list[str]]:
    """What was measured of the final training run: its wall time and its process CPU time."""
    tr, cp = c.doc["training"], c.doc["compute"]
    text = f"measured: wall time {c.t(tr['wall_s'])} s (run.finished wall_s, from the run's plan to its last record)"
    ids = [tr["wall_s"]]
    train_cpu = cp["train"]["cpu_s"]
    if train_cpu:
        text += f", process CPU time {c.t(train_cpu)} s ({compute.CPU_S_SCOPE})"
        ids.append(train_cpu)
    else:
        text += "; process CPU time not measured (the run predates run.finished cpu_s)"
    return text, ids


def _compute(c: Ctx) -> tuple[str, list[str]]:
    tr, n = c.doc["training"], c.doc["model"]["n_params"]
    measured, ids = _measured(c)
    return (f"final training run {c.doc['compute']['train']['run_id']}: {c.t(tr['flops'])} FLOPs, "
            f"an estimate, not counted (6 x {c.t(n)} parameters x {c.t(tr['tokens_seen'])} tokens seen); "
            f"{measured}"), [tr["flops"], *ids]


def _estimate(c: Ctx, scope: dict[str, Any], which: int) -> str | None:
    """The energy (``which`` 0) or carbon (1) estimate of the hours in ``scope`` (doc["compute"] or its
    "train"), as the report's Compute section computes it; None without params.yaml: report.energy."""
    est = energy.compute_energy(lambda fid: c.facts[fid]["value"], scope, c.meta.get("energy"))
    return None if est is None else (energy.kwh_text, energy.co2_text)[which](est[which])


def _energy(c: Ctx, which: int, final: bool) -> tuple[str, list[str]] | None:
    """The energy (``which`` 0) or carbon (1) estimate of the final training run (``final``) or of every run
    behind the model, from its hours and params.yaml's assumptions; what was measured and what was not."""
    cp = c.doc["compute"]
    scope = cp["train"] if final else cp
    value, total = _estimate(c, scope, which), _estimate(c, cp, which)
    if value is None or total is None:
        return None
    whose = (f"the final training run {scope['run_id']}" if scope is not cp
             else f"the {cp['runs']} runs behind the model")
    hours = [scope["cpu_hours"], *([scope["gpu_hours"]] if scope["gpu_hours"] else [])]
    text = (f"not measured: no power meter or energy counter is read. Estimate: {value} for {whose}, from "
            f"{'its' if scope is not cp else 'their'} "
            f"CPU-hours {c.t(scope['cpu_hours'])} (wall time x usable cores: the cores held, not the CPU time used)"
            + (f" and GPU-hours {c.t(scope['gpu_hours'])}" if scope["gpu_hours"] else "")
            + " and the power per core and per GPU, data-centre PUE" + (" and grid carbon intensity" if which else "")
            + " assumed in params.yaml: report.energy")
    if scope is not cp:
        measured, ids = _measured(c)
        text += f"; {measured}; all {cp['runs']} runs behind the model, estimated the same way: {total}"
        hours += [*ids, cp["cpu_hours"]]
    elif cp["cpu_s"]:
        text += (f"; measured: process CPU time {c.t(cp['cpu_s'])} s over the {cp['cpu_s_runs']} runs that record it "
                 f"({compute.CPU_S_SCOPE})")
        hours.append(cp["cpu_s"])
    return text, hours


def _public(c: Ctx) -> tuple[str, list[str]] | None:
    """The sources others can fetch (a package index or a URL, not a path on this machine)."""
    local = tuple(f"{k}:" for k in LOCAL_KINDS)  # a locator is <kind>:<where>
    ss = [s for s in c.doc["data"]["sources"] if not str(c.facts[s["locator"]]["value"]).startswith(local)]
    if not ss:
        return None
    return "public sources: " + "; ".join(f"{s['name']} ({c.t(s['locator'])}, licence {c.t(s['license'])})"
                                          for s in ss), [s[k] for s in ss for k in ("locator", "license")]


def _language(c: Ctx) -> tuple[str, list[str]] | None:
    langs, ss = c.meta.get("language"), c.doc["data"]["sources"]
    return (f"{', '.join(langs)} (params.yaml: report.language): the text of the sources "
            f"{', '.join(s['name'] for s in ss)}", [s["locator"] for s in ss]) if langs else None


def _responsible_use(c: Ctx) -> tuple[str, list[str]]:
    r = c.meta["report_dir"]
    return (f"intended use, out-of-scope uses, limitations and risks: sections of {r}/model_card.md and "
            f"{r}/report.md"), [c.doc["model"]["tensor_digest"]]


def _duration(c: Ctx) -> tuple[str, list[str]]:
    measured, ids = _measured(c)
    return (f"final training run only, {measured}; process start and imports are outside the wall time, and the "
            "duration of the project's development as a whole is not recorded"), ids


def _hardware(c: Ctx) -> tuple[str, list[str]]:
    e, dc = c.doc["environment"]["env"], c.doc["environment"]["determinism_class"]
    ids = [dc[k] for k in ("device_count", "backend", "device_kind") if k in dc] + [e["cpu_model"], e["cores_used"]]
    return (f"{c.t(dc.get('device_count'))} {c.t(dc.get('backend'))} device(s) of kind "
            f"{c.t(dc.get('device_kind'))}; CPU {c.t(e['cpu_model'])}, cores used {c.t(e['cores_used'])}"), ids


def _stages(c: Ctx) -> tuple[str, list[str]] | None:
    m, stages = c.doc["model"], [r["stage"] for r in c.doc["lineage"]]
    if stages.count("train") != 1:
        return None
    i = stages.index("train")
    return (f"{', '.join(stages[:i])}, then one pre-training stage of {c.t(m['steps'])} optimizer steps (recipe "
            f"{c.t(m['recipe_digest'])}), then {', '.join(stages[i + 1:]) or 'no further stage'}; no "
            "fine-tuning"), [m["steps"], m["recipe_digest"]]


def _objectives(c: Ctx) -> tuple[str, list[str]]:
    tr, hp = c.doc["training"], c.doc["training"]["hyperparameters"]
    ids = [hp[k] for k in ("lr", "schedule", "warmup_steps", "weight_decay", "batch_size") if k in hp]
    text = "pre-training by next-token cross-entropy; " + ", ".join(
        f"{k} {c.t(hp[k])}" for k in ("lr", "schedule", "warmup_steps", "weight_decay", "batch_size") if k in hp)
    if "final_loss" in tr:
        text += f"; final training loss {c.t(tr['final_loss'])} at step {c.t(tr['final_step'])}"
        ids += [tr["final_loss"], tr["final_step"]]
    return text, ids


def _frameworks(c: Ctx, names: Iterable[str] | None = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint")
                ) -> tuple[str, list[str]]:
    pk = c.packages(names)
    return ", ".join(f"{n} {c.t(f)}" for n, f in pk), [f for _, f in pk]


def _dependencies(c: Ctx) -> tuple[str, list[str]]:
    text, ids = _frameworks(c, None)
    py = c.doc["environment"]["env"]["python"]
    return f"no external services or models; python {c.t(py)}; packages {text}", [py, *ids]


def _arch(c: Ctx) -> tuple[str, list[str]]:
    a = c.doc["model"]["architecture"]
    return "decoder-only transformer: " + ", ".join(f"{k} {c.t(f)}" for k, f in a.items()), list(a.values())


def _size(c: Ctx) -> tuple[str, list[str]]:
    return f"{c.t(c.doc['model']['n_params'])} parameters (one component)", [c.doc["model"]["n_params"]]


def _modality(c: Ctx, what: str) -> tuple[str, list[str]]:
    tok = c.doc["data"]["tokenizer"]
    return f"text {what} ({c.t(tok['type'])} tokens, vocabulary {c.t(tok['vocab_size'])})", \
        [tok["type"], tok["vocab_size"]]


def _basic(c: Ctx) -> tuple[str, list[str]]:
    (mod, i1), (size, i2), (arch, i3) = _modality(c, "in, text out"), _size(c), _arch(c)
    return f"{mod}; {size}; {arch}", i1 + i2 + i3


def _deeper(c: Ctx) -> tuple[str, list[str]]:
    arch, ids = _arch(c)
    code = c.doc["environment"]["code"]["git_commit"]
    return f"{arch}; implementation marin/model at commit {c.t(code)}", [*ids, code]


def _docs(c: Ctx) -> tuple[str, list[str]]:
    r, m = c.meta["report_dir"], c.doc["model"]
    return (f"{r}/model_card.md, {r}/datasheet.md and {r}/report.md document the model with tensor digest "
            f"{c.t(m['tensor_digest'])}"), [m["tensor_digest"]]


def _weights(c: Ctx) -> tuple[str, list[str]]:
    m = c.doc["model"]
    return (f"weights released in {m['path']} under {c.meta['license']} (tensor digest "
            f"{c.t(m['tensor_digest'])}), with checkpoints in checkpoints/"), [m["tensor_digest"]]


def _licence(c: Ctx) -> tuple[str, list[str]]:
    m = c.doc["model"]
    return f"model licence {c.meta['license']} for the weights {c.t(m['tensor_digest'])}", [m["tensor_digest"]]


def _code(c: Ctx) -> tuple[str, list[str]]:
    code = c.doc["environment"]["code"]
    return (f"training and inference code (marin/, pipeline/) under {c.meta.get('code_license', NR)} at git "
            f"commit {c.t(code['git_commit'])}, code digest {c.t(code['code_digest'])}, lock "
            f"{c.t(code['lock_digest'])}"), [code["git_commit"], code["code_digest"], code["lock_digest"]]


def _dependencies_model(c: Ctx) -> tuple[str, list[str]] | None:
    init = c.doc["training"]["seeds"]["streams"].get("init")
    if init is None or [r["stage"] for r in c.doc["lineage"]].count("train") != 1:
        return None
    return (f"derived from no other model: random initialisation from seed stream init {c.t(init)}; the lineage "
            f"holds no model input ({' -> '.join(r['stage'] for r in c.doc['lineage'])})"), [init]


def _evaluation(c: Ctx) -> tuple[str, list[str]] | None:
    ev = c.evaluation
    if not ev or not ev["rows"]:
        return None
    return "; ".join(f"{r['name']} on {r['split']} ({r['corpus']}): {c.t(r['bits_per_byte'])} bits per byte, "
                     f"perplexity {c.t(r['perplexity'])} over {c.t(r['tokens'])} tokens" for r in ev["rows"]), \
        [r[k] for r in ev["rows"] for k in ("bits_per_byte", "perplexity", "tokens")]


def _eval_repro(c: Ctx) -> tuple[str, list[str]] | None:
    ev = c.evaluation
    if not ev:
        return None
    code, ver = c.doc["environment"]["code"]["git_commit"], verification(c, "evaluate")
    text = (f"evaluation code marin/evaluate and pipeline/evaluate.py (open source, "
            f"{c.meta.get('code_license', NR)}) at commit {c.t(code)}; validation split in data/tokens; run "
            f"{ev['run_id']} is re-runnable with `marin verify`")
    return (text + (f" (verified: {c.t(ver)})" if ver else "")), [code] + ([ver] if ver else [])


# indicator name (2024 and Dec-2025 lists) -> (domain, subdomain, how to disclose it)
FMTI_MAP: dict[str, tuple[str, str, Disclose]] = {
    "Data size": ("Upstream", "Data", _data_size),
    "Data sources": ("Upstream", "Data", _data_sources),
    "Data acquisition methods": ("Upstream", "Data", _data_sources),
    "Data curation": ("Upstream", "Data", _curation),
    "Data processing methods": ("Upstream", "Data", _curation),
    "Data processing techniques": ("Upstream", "Data", _techniques),
    "Data license": ("Upstream", "Data", _data_license),
    "Data domain composition": ("Upstream", "Data", _domains),
    "Data replicability": ("Upstream", "Data", _replicability),
    "Compute usage": ("Upstream", "Compute", _compute),
    "Compute usage for final training run": ("Upstream", "Compute", _compute),
    "Development duration": ("Upstream", "Compute", _duration),
    "Development duration for final training run": ("Upstream", "Compute", _duration),
    "Energy usage for final training run": ("Upstream", "Compute", lambda c: _energy(c, 0, True)),
    "Carbon emissions for final training run": ("Upstream", "Compute", lambda c: _energy(c, 1, True)),
    "Energy usage": ("Upstream", "Compute", lambda c: _energy(c, 0, False)),  # 2024: in building the model
    "Carbon emissions": ("Upstream", "Compute", lambda c: _energy(c, 1, False)),
    "Public datasets": ("Upstream", "Data", _public),
    "Data language composition": ("Upstream", "Data", _language),
    "Documentation for responsible use": ("Downstream", "Usage policy", _responsible_use),
    "Permitted, restricted, and prohibited uses": ("Downstream", "Usage policy", _responsible_use),
    "Compute hardware": ("Upstream", "Compute", _hardware),
    "Compute hardware for final training run": ("Upstream", "Compute", _hardware),
    "Model stages": ("Upstream", "Methods", _stages),
    "Model objectives": ("Upstream", "Methods", _objectives),
    "Core frameworks": ("Upstream", "Methods", _frameworks),
    "Additional dependencies": ("Upstream", "Methods", _dependencies),
    "Code access": ("Upstream", "Methods", _code),
    "Input modality": ("Model", "Model basics", lambda c: _modality(c, "in")),
    "Output modality": ("Model", "Model basics", lambda c: _modality(c, "out")),
    "Model components": ("Model", "Model basics", _arch),
    "Model size": ("Model", "Model basics", _size),
    "Model architecture": ("Model", "Model basics", _arch),
    "Basic model properties": ("Model", "Model basics", _basic),
    "Deeper model properties": ("Model", "Model basics", _deeper),
    "Model dependencies": ("Model", "Model basics", _dependencies_model),
    "Centralized model documentation": ("Model", "Model basics", _docs),
    "Full external model access": ("Model", "Model access", _weights),
    "Open weights": ("Model", "Model access", _weights),
    "Evaluation of capabilities": ("Model", "Capabilities", _evaluation),
    "Capabilities evaluation": ("Model", "Capabilities", _evaluation),
    "External reproducibility of capabilities evaluation": ("Model", "Capabilities", _eval_repro),
    "Model License": ("Downstream", "Distribution", _licence),
    "Terms of use": ("Downstream", "Distribution", _licence),
}
_FMTI_BY_KEY = {k.strip().lower(): v for k, v in FMTI_MAP.items()}


def _indicators(path: Path) -> list[tuple[str, str, str]]:
    try:
        text = readers.read_text(path, "text", ReportError).removeprefix("\ufeff")  # a BOM, as utf-8-sig
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
    except FileNotFoundError:
        raise ReportError(f"{path}: no such FMTI indicator list; restore marin/report/reference/") from None
    except csv.Error as e:
        raise ReportError(f"{path}: not a readable CSV ({e}); use an indicators CSV of stanford-crfm/fmti") from None
    if not rows or not {"Domain", "Subdomain", "Indicator"} <= set(rows[0]):
        raise ReportError(f"{path}: not an FMTI indicator list (needs columns Domain, Subdomain, Indicator); "
                          "use an indicators CSV of stanford-crfm/fmti")
    return [(r["Domain"].strip(), r["Subdomain"].strip(), r["Indicator"].strip()) for r in rows]


def fmti(facts: dict[str, Any], doc: dict[str, Any], meta: dict[str, Any], indicators_csv: Path) -> str:
    """FMTI per-developer disclosures as CSV: one row per indicator of ``indicators_csv``."""
    c = Ctx(facts, doc, meta)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(FMTI_COLUMNS)
    for dom, sub, name in _indicators(Path(indicators_csv)):
        entry = _FMTI_BY_KEY.get(name.lower())
        got = entry[2](c) if entry else None
        if got is None:
            w.writerow([dom, sub, name, "no", NOT_DISCLOSED, ""])
        else:
            text, ids = got
            refs = [r for r in ids if "#" in r] + c.refs(*[i for i in ids if "#" not in i])
            w.writerow([dom, sub, name, "yes", text, " ".join(dict.fromkeys(refs))])
    return buf.getvalue()
