"""The report in the shapes others read: a Hugging Face model card, a datasheet (Gebru et al.
2021), an FMTI per-developer disclosure CSV and a Model Openness Framework release file.

Every value comes from ``facts`` (see ``marin.report.facts``); Markdown cites a fact as a
link ``[text](report.md#F<n>)``. What the records do not hold is written "not recorded".
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from marin.report.facts import ReportError, md_escape

NR = "not recorded"
NOT_DISCLOSED = "not disclosed: not in the pipeline's records"
FMTI_COLUMNS = ("domain", "subdomain", "indicator", "disclosed", "disclosure", "evidence")
# Hugging Face licence ids are the SPDX ids in lower case; others go in as "other".
_HF_LICENSES = {"apache-2.0", "mit", "bsd-2-clause", "bsd-3-clause", "cc0-1.0", "cc-by-4.0", "cc-by-sa-4.0",
                "cc-by-nc-4.0", "gpl-3.0", "lgpl-3.0", "agpl-3.0", "mpl-2.0", "unlicense", "odc-by", "pddl",
                "cdla-permissive-2.0", "openrail"}


@dataclass(frozen=True)
class _Ctx:
    facts: dict[str, Any]
    doc: dict[str, Any]
    meta: dict[str, Any]

    def t(self, fid: str | None) -> str:
        """A fact's printed text, plain."""
        return self.facts[fid]["text"] if fid in self.facts else NR

    def md(self, fid: str | None) -> str:
        """A fact as a Markdown link to its source in report.md."""
        if fid not in self.facts:
            return NR
        text = self.facts[fid]["text"]
        if "\n" in text:  # a link cannot hold a line break; the report shows the value
            return f"(a multi-line value: fact {fid} of report.md)"
        return "[" + md_escape(text) + f"](report.md#{fid})"

    def refs(self, *fids: str) -> list[str]:
        """Ledger references ``run_id#seq`` behind facts; derived facts give their inputs'."""
        out: list[str] = []
        for fid in fids:
            src = self.facts[fid]["source"]
            refs = self.refs(*src["inputs"]) if "inputs" in src else [f"{src['run_id']}#{src['seq']}"]
            out += [r for r in refs if r not in out]
        return out

    @property
    def evaluation(self) -> dict[str, Any] | None:
        return self.doc.get("evaluation")

    def packages(self, names: Iterable[str] | None = None) -> list[tuple[str, str]]:
        pk = self.doc["environment"]["packages"]
        return [(n, pk[n]) for n in (names if names is not None else pk) if n in pk]


def _licence_names(c: _Ctx, fids: Iterable[str]) -> str:
    names = sorted({str(c.facts[f]["value"]) for f in fids if f in c.facts})
    return " AND ".join(names) if names else ""


def _sources(c: _Ctx) -> list[str]:
    return [s["name"] for s in c.doc["data"]["sources"]]


def _verification(c: _Ctx, stage: str) -> str | None:
    return next((v["result"] for v in c.doc["verification"] if v["stage"] == stage and v["result"]), None)


# ---------------------------------------------------------------- model card


def _front_matter(c: _Ctx) -> dict[str, Any]:
    lic = str(c.meta["license"]).lower()
    fm: dict[str, Any] = {"license": lic if lic in _HF_LICENSES else "other"}
    if fm["license"] == "other":
        fm["license_name"] = str(c.meta["license"])
    fm |= {"datasets": _sources(c), "library_name": "jax", "pipeline_tag": "text-generation",
           "tags": ["marin", "jax", "flax", "causal-lm", "reproducible"]}
    rows = [r for r in (c.evaluation or {}).get("rows", []) if r["name"] == "model"]
    if rows:
        src = "+".join(_sources(c))
        results = [{"task": {"type": "text-generation", "name": "Causal language modeling"},
                    "dataset": {"name": f"{src} {r['split']} split ({r['corpus']})", "type": src,
                                "config": r["corpus"], "split": r["split"]},
                    "metrics": [{"type": k, "value": c.facts[r[k]]["value"], "name": f"{r['split']} {label}"}
                                for k, label in (("bits_per_byte", "bits per byte"), ("perplexity", "perplexity"))]}
                   for r in rows]
        fm["model-index"] = [{"name": c.meta["model_name"], "results": results}]
    return fm


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows] + [""]


def _sources_table(c: _Ctx) -> list[str]:
    return _table(["source", "locator", "licence", "archive digest", "bytes"],
                  ([f"`{s['name']}`", c.md(s["locator"]), c.md(s["license"]), c.md(s["digest"]), c.md(s["bytes"])]
                   for s in c.doc["data"]["sources"]))


def _splits_table(c: _Ctx) -> list[str]:
    rows = []
    for sp, v in c.doc["data"]["splits"].items():
        for name, x in [("all", v), *((f"`{k}`", x) for k, x in v["corpora"].items())]:
            rows.append([sp, name, c.md(x["docs"]), c.md(x["tokens"]), c.md(x["bytes"])])
    return _table(["split", "corpus", "documents", "tokens", "bytes"], rows)


def model_card(facts: dict[str, Any], doc: dict[str, Any], meta: dict[str, Any]) -> str:
    """A Hugging Face model card (README.md with YAML metadata) for the reported model."""
    c = _Ctx(facts, doc, meta)
    m, d, tr, env = doc["model"], doc["data"], doc["training"], doc["environment"]
    name, md = meta["model_name"], c.md
    out = ["---", yaml.safe_dump(_front_matter(c), sort_keys=False, allow_unicode=True).rstrip(), "---", "",
           f"# {name}", "",
           f"{name} is a decoder-only transformer language model trained from scratch by the marin pipeline. "
           "Every value below links to the ledger record it was read from, listed in the "
           "[technical report](report.md); the training data is described in the [datasheet](datasheet.md).", "",
           "## Model details", "",
           f"- Parameters: {md(m['n_params'])}; optimizer steps: {md(m['steps'])}",
           f"- Weights: `{m['path']}`, tensor digest {md(m['tensor_digest'])}",
           f"- Train recipe digest: {md(m['recipe_digest'])}",
           f"- Tokenizer: {md(d['tokenizer']['type'])}, vocabulary {md(d['tokenizer']['vocab_size'])}, "
           f"digest {md(d['tokenizer']['digest'])}",
           "- Frameworks: " + ", ".join(f"{n} {md(f)}" for n, f in c.packages(("jax", "flax", "optax"))),
           f"- Licence: {meta['license']}", "", "Architecture (the train run's model configuration):", ""]
    out += _table(["setting", "value"], ([f"`{k}`", md(f)] for k, f in m["architecture"].items()))
    out += ["## Uses", "",
            "Intended: research on reproducible language-model training, as a worked example whose every "
            "number can be re-derived from its ledger and re-run bit for bit.", "",
            "Out of scope: any use that relies on the model's outputs being correct, safe or fluent. It is "
            f"a model of {md(m['n_params'])} parameters trained on {md(tr['tokens_seen'])} tokens; no evaluation "
            f"of safety, bias or factuality is recorded.", "",
            "## Training data", ""]
    out += _sources_table(c)
    out += _splits_table(c)
    out += ["Curation (filters, deduplication) per corpus is in the [datasheet](datasheet.md).", "",
            "## Training procedure", "", "Hyperparameters:", ""]
    out += _table(["hyperparameter", "value"], ([f"`{k}`", md(f)] for k, f in tr["hyperparameters"].items()))
    s = tr["seeds"]
    out += [f"Seeds: root {md(s['root'])}; each stream is derived as {md(s['derivation'])}: "
            + ", ".join(f"`{n}` {md(f)}" for n, f in s["streams"].items()), "",
            f"Compute: {md(tr['tokens_seen'])} tokens seen (steps × batch size × sequence length); "
            f"{md(tr['flops'])} FLOPs (estimate 6 × parameters × tokens); wall time {md(tr['wall_s'])} s "
            f"on {md(env['determinism_class'].get('device_count'))} {md(env['determinism_class'].get('backend'))} "
            f"device(s), CPU {md(env['env']['cpu_model'])}, cores {md(env['env']['cores_used'])}.", ""]
    if "final_loss" in tr:
        out += [f"Final training loss {md(tr['final_loss'])} at step {md(tr['final_step'])}.", ""]
    out += ["## Evaluation", ""]
    ev = c.evaluation
    if ev and ev["rows"]:
        out += ["Bits per byte and perplexity on the held-out validation split, beside a unigram baseline "
                "fitted on the training split and scored on the same tokens.", ""]
        out += _table(["model", "corpus", "bits per byte", "perplexity", "tokens"],
                      ([f"`{r['name']}`", f"`{r['corpus']}`", md(r["bits_per_byte"]), md(r["perplexity"]),
                        md(r["tokens"])] for r in ev["rows"]))
        if ev["samples"]:
            out += ["Greedy completions of the prompts " + ", ".join(md(x["prompt"]) for x in ev["samples"])
                    + " are listed in the [technical report](report.md).", ""]
    else:
        out += [f"Evaluation: {NR}.", ""]
    out += ["## Reproducibility", "", "Ledger runs of the model's lineage and their re-execution by "
            "`marin verify`:", ""]
    out += _table(["stage", "run", "verification", "mode", "verified at"],
                  ([v["stage"], f"`{v['run_id']}`", md(v["result"]) if v["result"] else "no verification recorded",
                    md(v.get("mode")), md(v.get("when"))] for v in doc["verification"]))
    code = env["code"]
    out += [f"Code: git commit {md(code['git_commit'])}, code digest {md(code['code_digest'])}, lock file "
            f"digest {md(code['lock_digest'])}; determinism class digest {md(env['determinism_digest'])}.", "",
            "To reproduce: check out that commit, run `dvc repro`, then `marin verify models/final --upstream`.",
            "", "## Limitations", ""]
    base = {r["corpus"]: r for r in (ev or {}).get("rows", []) if r["name"] == "unigram_baseline"}
    for r in [r for r in (ev or {}).get("rows", []) if r["name"] == "model" and r["corpus"] in base]:
        b = base[r["corpus"]]
        mv, bv = facts[r["bits_per_byte"]]["value"], facts[b["bits_per_byte"]]["value"]
        rel = "above (worse than)" if mv > bv else "equal to" if mv == bv else "below (better than)"
        out += [f"- On `{r['corpus']}` the model's bits per byte {md(r['bits_per_byte'])} is {rel} the unigram "
                f"baseline's {md(b['bits_per_byte'])}."]
    out += [f"- Small data: the training split holds {md(d['splits']['train']['tokens'])} tokens and training "
            f"saw {md(tr['tokens_seen'])} token positions; capabilities beyond the validation bits per byte are "
            "not evaluated.",
            f"- Evaluations of bias, toxicity, memorisation or safety: {NR}.", "",
            "## Citation and licence", "",
            f"Weights and this card: {meta['license']}; code: {meta.get('code_license', NR)}. Research paper: "
            f"{NR}; cite the technical report "
            f"(`{meta['report_dir']}/report.md`) and the ledger run ids above.", ""]
    return "\n".join(out)


# ---------------------------------------------------------------- datasheet


def datasheet(facts: dict[str, Any], doc: dict[str, Any], meta: dict[str, Any]) -> str:
    """A datasheet for the training data, with the seven sections of Gebru et al. (2021)."""
    c = _Ctx(facts, doc, meta)
    d, md, name = doc["data"], c.md, meta["model_name"]
    tok, ev = d["tokenizer"], c.evaluation
    fs = f"{d['filters_source']['run_id']}#{d['filters_source']['seq']}"
    out = [f"# Datasheet: training data of {name}", "",
           "Answers to the questions of *Datasheets for Datasets* (Gebru et al., 2021). Every value links to "
           "its ledger record in the [technical report](report.md); what the records do not hold is marked "
           f"\"{NR}\".", "",
           "## Motivation", "",
           f"- Purpose: to pre-train and evaluate the language model {name} with the marin pipeline.",
           f"- Who created the dataset, on whose behalf: {NR}.", f"- Funding: {NR}.", "",
           "## Composition", "",
           "- Instances: text documents, each from one corpus of a source; no labels or targets.",
           "- Sources (the data is a curated subset of them):", ""]
    out += _sources_table(c)
    out += ["- Splits, recommended as they are (validation is held out from training):", ""]
    out += _splits_table(c)
    out += [f"- Missing information, errors or redundancies: beyond the filters below, {NR}.",
            f"- Confidential data, personal information, offensive content: {NR}.",
            f"- Sub-populations or individuals identifiable: {NR}.", "",
            "## Collection process", "",
            "- Acquisition: each source archive was fetched from its locator and checked against its pinned "
            f"digest by the fetch run `{doc['lineage'][0]['run_id']}` (table above).",
            f"- Sampling strategy: whole sources were taken; the validation split is a salted hash split "
            f"(configured in the curate run's parameters, `{fs}` at `/body/params/curate/split`).",
            f"- Who collected the data and how they were compensated: {NR}.",
            f"- Time frame of the data's creation: {NR}.",
            f"- Ethical review, notice and consent of the people in the data: {NR}.", "",
            "## Preprocessing/cleaning/labeling", "",
            "Curation funnel per corpus (documents and bytes in, removed by each filter, kept):", ""]
    for f in d["funnel"]:
        out += [f"- `{f['corpus']}` (licence {md(f['license'])}): in {md(f['in_docs'])} documents / "
                f"{md(f['in_bytes'])} bytes; kept {md(f['kept_docs'])} / {md(f['kept_bytes'])}"]
        out += [f"  - removed by `{step}`: {md(r['docs'])} documents, {md(r['bytes'])} bytes"
                for step, r in f["removed"].items()] or ["  - no document removed"]
    filters = ", ".join(f"`{k}`" for k in d["curate_params"].get("filters", {})) or NR
    out += ["", f"- Filters configured: {filters}; their thresholds, the normalisation and the deduplication "
            f"settings are in the curate run's parameters (`{fs}` at `/body/params/curate`).",
            f"- Tokenization: {md(tok['type'])}, vocabulary {md(tok['vocab_size'])}, tokenizer digest "
            f"{md(tok['digest'])}.",
            "- Labeling: none.",
            "- Raw data kept: yes, `data/raw` (fetch output); curated text in `data/curated`, tokens in "
            "`data/tokens`. Software: `marin/data`, `pipeline/`.", "",
            "## Uses", "",
            f"- Used for: training {name}"
            + (f"; its validation split for the evaluation in run `{ev['run_id']}`." if ev else "."),
            f"- Other tasks it could be used for, and tasks it should not be used for: {NR}.",
            f"- Impacts of its composition on future uses: {NR}.", "",
            "## Distribution", "",
            "- Distributed with the project (`data/`, tracked by DVC) under the licences of its sources: "
            + ", ".join(f"`{s['name']}` {md(s['license'])}" for s in d["sources"]) + ".",
            f"- Third-party IP restrictions or export controls: beyond the licences, {NR}.", "",
            "## Maintenance", "",
            f"- Maintainer and contact: {NR}.", f"- Erratum: {NR}.",
            "- Updates: a change is a new ledger run of the pipeline; every run is kept in `ledger/runs`.",
            f"- Retention limits, and how others may contribute: {NR}.", ""]
    return "\n".join(out)


# ---------------------------------------------------------------- FMTI

Disclose = Callable[[_Ctx], tuple[str, list[str]] | None]


def _data_size(c: _Ctx) -> tuple[str, list[str]]:
    sp = c.doc["data"]["splits"]
    ids = [v[k] for v in sp.values() for k in ("docs", "tokens", "bytes")]
    return "; ".join(f"{n}: {c.t(v['docs'])} documents, {c.t(v['tokens'])} tokens, {c.t(v['bytes'])} bytes "
                     "of text" for n, v in sp.items()), ids


def _data_sources(c: _Ctx) -> tuple[str, list[str]]:
    ss = c.doc["data"]["sources"]
    return "; ".join(f"{s['name']}: fetched from {c.t(s['locator'])}, licence {c.t(s['license'])}, archive "
                     f"{c.t(s['digest'])} ({c.t(s['bytes'])} bytes)" for s in ss), \
        [s[k] for s in ss for k in ("locator", "license", "digest", "bytes")]


def _curation(c: _Ctx) -> tuple[str, list[str]]:
    parts, ids = [], []
    for f in c.doc["data"]["funnel"]:
        removed = ", ".join(f"{step} {c.t(r['docs'])} documents/{c.t(r['bytes'])} bytes"
                            for step, r in f["removed"].items()) or "none"
        parts.append(f"{f['corpus']}: {c.t(f['in_docs'])} documents ({c.t(f['in_bytes'])} bytes) in; removed: "
                     f"{removed}; kept {c.t(f['kept_docs'])} ({c.t(f['kept_bytes'])} bytes)")
        ids += [f[k] for k in ("in_docs", "in_bytes", "kept_docs", "kept_bytes")]
        ids += [r[k] for r in f["removed"].values() for k in ("docs", "bytes")]
    return "quality filters and exact/near deduplication per corpus: " + "; ".join(parts), ids


def _techniques(c: _Ctx) -> tuple[str, list[str]]:
    text, ids = _curation(c)
    fs = c.doc["data"]["filters_source"]
    names = ", ".join(c.doc["data"]["curate_params"].get("filters", {})) or NR
    return (f"filters {names}; thresholds, normalisation and dedup settings in the curate run's parameters "
            f"(/body/params/curate of {fs['run_id']}#{fs['seq']}). {text}", [*ids, f"{fs['run_id']}#{fs['seq']}"])


def _data_license(c: _Ctx) -> tuple[str, list[str]]:
    d = c.doc["data"]
    return "; ".join([f"source {s['name']}: {c.t(s['license'])}" for s in d["sources"]]
                     + [f"corpus {f['corpus']}: {c.t(f['license'])}" for f in d["funnel"]]), \
        [s["license"] for s in d["sources"]] + [f["license"] for f in d["funnel"]]


def _domains(c: _Ctx) -> tuple[str, list[str]]:
    tr = c.doc["data"]["splits"]["train"]["corpora"]
    return "training split by corpus: " + "; ".join(
        f"{n}: {c.t(v['docs'])} documents, {c.t(v['tokens'])} tokens" for n, v in tr.items()), \
        [v[k] for v in tr.values() for k in ("docs", "tokens")]


def _replicability(c: _Ctx) -> tuple[str, list[str]]:
    text, ids = _data_sources(c)
    checks = [f"{v['stage']} {c.t(v['result'])}" for v in c.doc["verification"]
              if v["stage"] in ("fetch", "curate", "tokenize") and v["result"]]
    ids += [v["result"] for v in c.doc["verification"] if v["stage"] in ("fetch", "curate", "tokenize")
            and v["result"]]
    return (f"{text}; curation and tokenization are recorded ledger runs that re-run from these archives"
            + (f" (verification: {', '.join(checks)})" if checks else "")), ids


def _compute(c: _Ctx) -> tuple[str, list[str]]:
    tr, n = c.doc["training"], c.doc["model"]["n_params"]
    return (f"{c.t(tr['flops'])} FLOPs for the single training run (estimate 6 x {c.t(n)} parameters x "
            f"{c.t(tr['tokens_seen'])} tokens seen)"), [tr["flops"]]


def _duration(c: _Ctx) -> tuple[str, list[str]]:
    return f"training run wall time {c.t(c.doc['training']['wall_s'])} s", [c.doc["training"]["wall_s"]]


def _hardware(c: _Ctx) -> tuple[str, list[str]]:
    e, dc = c.doc["environment"]["env"], c.doc["environment"]["determinism_class"]
    ids = [dc[k] for k in ("device_count", "backend", "device_kind") if k in dc] + [e["cpu_model"], e["cores_used"]]
    return (f"{c.t(dc.get('device_count'))} {c.t(dc.get('backend'))} device(s) of kind "
            f"{c.t(dc.get('device_kind'))}; CPU {c.t(e['cpu_model'])}, cores used {c.t(e['cores_used'])}"), ids


def _stages(c: _Ctx) -> tuple[str, list[str]] | None:
    m, stages = c.doc["model"], [r["stage"] for r in c.doc["lineage"]]
    if stages.count("train") != 1:
        return None
    i = stages.index("train")
    return (f"{', '.join(stages[:i])}, then one pre-training stage of {c.t(m['steps'])} optimizer steps (recipe "
            f"{c.t(m['recipe_digest'])}), then {', '.join(stages[i + 1:]) or 'no further stage'}; no "
            "fine-tuning"), [m["steps"], m["recipe_digest"]]


def _objectives(c: _Ctx) -> tuple[str, list[str]]:
    tr, hp = c.doc["training"], c.doc["training"]["hyperparameters"]
    ids = [hp[k] for k in ("lr", "schedule", "warmup_steps", "weight_decay", "batch_size") if k in hp]
    text = "pre-training by next-token cross-entropy; " + ", ".join(
        f"{k} {c.t(hp[k])}" for k in ("lr", "schedule", "warmup_steps", "weight_decay", "batch_size") if k in hp)
    if "final_loss" in tr:
        text += f"; final training loss {c.t(tr['final_loss'])} at step {c.t(tr['final_step'])}"
        ids += [tr["final_loss"], tr["final_step"]]
    return text, ids


def _frameworks(c: _Ctx, names: Iterable[str] | None = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint")
                ) -> tuple[str, list[str]]:
    pk = c.packages(names)
    return ", ".join(f"{n} {c.t(f)}" for n, f in pk), [f for _, f in pk]


def _dependencies(c: _Ctx) -> tuple[str, list[str]]:
    text, ids = _frameworks(c, None)
    py = c.doc["environment"]["env"]["python"]
    return f"no external services or models; python {c.t(py)}; packages {text}", [py, *ids]


def _arch(c: _Ctx) -> tuple[str, list[str]]:
    a = c.doc["model"]["architecture"]
    return "decoder-only transformer: " + ", ".join(f"{k} {c.t(f)}" for k, f in a.items()), list(a.values())


def _size(c: _Ctx) -> tuple[str, list[str]]:
    return f"{c.t(c.doc['model']['n_params'])} parameters (one component)", [c.doc["model"]["n_params"]]


def _modality(c: _Ctx, what: str) -> tuple[str, list[str]]:
    tok = c.doc["data"]["tokenizer"]
    return f"text {what} ({c.t(tok['type'])} tokens, vocabulary {c.t(tok['vocab_size'])})", \
        [tok["type"], tok["vocab_size"]]


def _basic(c: _Ctx) -> tuple[str, list[str]]:
    (mod, i1), (size, i2), (arch, i3) = _modality(c, "in, text out"), _size(c), _arch(c)
    return f"{mod}; {size}; {arch}", i1 + i2 + i3


def _deeper(c: _Ctx) -> tuple[str, list[str]]:
    arch, ids = _arch(c)
    code = c.doc["environment"]["code"]["git_commit"]
    return f"{arch}; implementation marin/model at commit {c.t(code)}", [*ids, code]


def _docs(c: _Ctx) -> tuple[str, list[str]]:
    r, m = c.meta["report_dir"], c.doc["model"]
    return (f"{r}/model_card.md, {r}/datasheet.md and {r}/report.md document the model with tensor digest "
            f"{c.t(m['tensor_digest'])}"), [m["tensor_digest"]]


def _weights(c: _Ctx) -> tuple[str, list[str]]:
    m = c.doc["model"]
    return (f"weights released in {m['path']} under {c.meta['license']} (tensor digest "
            f"{c.t(m['tensor_digest'])}), with checkpoints in checkpoints/"), [m["tensor_digest"]]


def _licence(c: _Ctx) -> tuple[str, list[str]]:
    m = c.doc["model"]
    return f"model licence {c.meta['license']} for the weights {c.t(m['tensor_digest'])}", [m["tensor_digest"]]


def _code(c: _Ctx) -> tuple[str, list[str]]:
    code = c.doc["environment"]["code"]
    return (f"training and inference code (marin/, pipeline/) under {c.meta.get('code_license', NR)} at git "
            f"commit {c.t(code['git_commit'])}, code digest {c.t(code['code_digest'])}, lock "
            f"{c.t(code['lock_digest'])}"), [code["git_commit"], code["code_digest"], code["lock_digest"]]


def _dependencies_model(c: _Ctx) -> tuple[str, list[str]] | None:
    init = c.doc["training"]["seeds"]["streams"].get("init")
    if init is None or [r["stage"] for r in c.doc["lineage"]].count("train") != 1:
        return None
    return (f"derived from no other model: random initialisation from seed stream init {c.t(init)}; the lineage "
            f"holds no model input ({' -> '.join(r['stage'] for r in c.doc['lineage'])})"), [init]


def _evaluation(c: _Ctx) -> tuple[str, list[str]] | None:
    ev = c.evaluation
    if not ev or not ev["rows"]:
        return None
    return "; ".join(f"{r['name']} on {r['split']} ({r['corpus']}): {c.t(r['bits_per_byte'])} bits per byte, "
                     f"perplexity {c.t(r['perplexity'])} over {c.t(r['tokens'])} tokens" for r in ev["rows"]), \
        [r[k] for r in ev["rows"] for k in ("bits_per_byte", "perplexity", "tokens")]


def _eval_repro(c: _Ctx) -> tuple[str, list[str]] | None:
    ev = c.evaluation
    if not ev:
        return None
    code, ver = c.doc["environment"]["code"]["git_commit"], _verification(c, "evaluate")
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
    with open(path, newline="", encoding="utf-8-sig") as fh:
        rows = list(csv.DictReader(fh))
    if not rows or not {"Domain", "Subdomain", "Indicator"} <= set(rows[0]):
        raise ReportError(f"{path}: not an FMTI indicator list (needs columns Domain, Subdomain, Indicator); "
                          "pass the indicators CSV of stanford-crfm/fmti")
    return [(r["Domain"].strip(), r["Subdomain"].strip(), r["Indicator"].strip()) for r in rows]


def fmti(facts: dict[str, Any], doc: dict[str, Any], meta: dict[str, Any], indicators_csv: Path | None) -> str:
    """FMTI per-developer disclosures as CSV: one row per indicator of ``indicators_csv``, or only
    the indicators this pipeline maps when no list is given."""
    c = _Ctx(facts, doc, meta)
    if indicators_csv is not None and Path(indicators_csv).is_file():
        indicators = _indicators(Path(indicators_csv))
    else:
        indicators = [(dom, sub, name) for name, (dom, sub, _) in FMTI_MAP.items()]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(FMTI_COLUMNS)
    for dom, sub, name in indicators:
        entry = _FMTI_BY_KEY.get(name.lower())
        got = entry[2](c) if entry else None
        if got is None:
            w.writerow([dom, sub, name, "no", NOT_DISCLOSED, ""])
        else:
            text, ids = got
            refs = [r for r in ids if "#" in r] + c.refs(*[i for i in ids if "#" not in i])
            w.writerow([dom, sub, name, "yes", text, " ".join(dict.fromkeys(refs))])
    return buf.getvalue()


# ---------------------------------------------------------------- Model Openness Framework

MOF_VERSION, MOF_DATE = "1.0", "2024-12-15"
NOT_INCLUDED, NOT_SPECIFIED = "Component not included", "License not specified"
# component -> (MOF class, required for the class, accepted licence content types)
MOF_COMPONENTS: dict[str, tuple[int, bool, tuple[str, ...]]] = {
    "Model architecture": (3, True, ("code",)),
    "Data preprocessing code": (1, True, ("code",)),
    "Training code": (2, True, ("code",)),
    "Inference code": (2, True, ("code",)),
    "Evaluation code": (2, True, ("code",)),
    "Supporting libraries and tools": (2, False, ("code",)),
    "Model parameters (Final)": (3, True, ("data", "code")),
    "Model parameters (Intermediate)": (1, True, ("data",)),
    "Datasets": (1, True, ("data", "code", "document")),
    "Evaluation data": (2, True, ("data",)),
    "Model metadata": (1, False, ("data",)),
    "Sample model outputs": (3, False, ("data", "code", "document")),
    "Model card": (3, True, ("document", "code")),
    "Data card": (3, True, ("document", "code")),
    "Technical report": (3, True, ("document", "code")),
    "Research paper": (1, True, ("document",)),
    "Evaluation results": (3, True, ("document", "code")),
}
MOF_CLASSES = {1: "Class I - Open Science", 2: "Class II - Open Tooling", 3: "Class III - Open Model"}
# Used when no mof-licenses.json is given: common licences the MOF accepts, by content type.
OPEN_LICENSES = {
    "code": {"Apache-2.0", "MIT", "BSD-2-Clause", "BSD-3-Clause", "ISC", "0BSD", "MPL-2.0", "GPL-2.0-only",
             "GPL-3.0-only", "LGPL-3.0-only", "AGPL-3.0-only", "OpenMDW-1.0"},
    "data": {"CDLA-Permissive-1.0", "CDLA-Permissive-2.0", "CC0-1.0", "PDDL-1.0", "CC-PDDC", "OpenMDW-1.0"},
    "document": {"Apache-2.0", "CC-BY-4.0", "CC-BY-SA-4.0", "CC0-1.0", "CC-PDDC", "OpenMDW-1.0"},
}


def mof(facts: dict[str, Any], doc: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """The MOF release file (schema ``mof_schema.json``) listing the project's 17 components."""
    c = _Ctx(facts, doc, meta)
    d, ev, r = doc["data"], c.evaluation, meta["report_dir"]
    code, model, docs = meta["code_license"], meta["model_license"], meta.get("docs_license", meta["code_license"])
    val = set(d["splits"].get("validation", {}).get("corpora", {}))
    data_lic = _licence_names(c, [f["license"] for f in d["funnel"]] or [s["license"] for s in d["sources"]])
    eval_lic = _licence_names(c, [f["license"] for f in d["funnel"] if f["corpus"] in val])
    have = {  # name -> (description, location, licence); absent names are not included
        "Model architecture": ("Decoder-only transformer in Flax NNX", "marin/model", code),
        "Data preprocessing code": ("Fetch, filter, deduplicate and tokenize the sources", "marin/data", code),
        "Training code": ("Training loop, optimizer, checkpoints and seeds", "marin/train", code),
        "Inference code": ("Scoring and greedy decoding of the trained model", "marin/evaluate", code),
        "Evaluation code": ("Bits per byte, perplexity and the unigram baseline", "marin/evaluate", code),
        "Supporting libraries and tools": ("Pipeline stages, provenance ledger and verifier", "pipeline/", code),
        "Model parameters (Final)": (f"Final weights, tensor digest {c.t(doc['model']['tensor_digest'])}",
                                     doc["model"]["path"], model),
        "Model parameters (Intermediate)": ("Training checkpoints with optimizer state", "checkpoints/", model),
        "Datasets": ("Raw, curated and tokenized training and validation data", "data/", data_lic),
        "Evaluation data": ("Validation split of the tokenized data", "data/tokens", eval_lic),
        "Model metadata": ("Resolved configuration and optimizer state stored in each checkpoint", "checkpoints/",
                           model),
        "Model card": ("Hugging Face model card", f"{r}/model_card.md", docs),
        "Data card": ("Datasheet for the training data", f"{r}/datasheet.md", docs),
        "Technical report": ("Report citing the ledger record of every value", f"{r}/report.md", docs),
    }
    if ev:
        have["Evaluation results"] = ("Validation metrics (DVC metrics file)", "metrics/eval.json", docs)
        if ev["samples"]:
            have["Sample model outputs"] = ("Greedy completions of fixed prompts (an eval record)",
                                            f"ledger/runs/{ev['run_id']}.jsonl", docs)
    components = []
    for name in MOF_COMPONENTS:
        desc, loc, lic = have.get(name, ("Not part of this release", "", NOT_INCLUDED))
        lic = lic or NOT_SPECIFIED
        path = f"https://spdx.org/licenses/{lic}.html" if re.fullmatch(r"[A-Za-z0-9.+-]+", lic) else ""
        components.append({"name": name, "description": desc, "location": loc, "license_name": lic,
                           "license_path": path if lic not in (NOT_INCLUDED, NOT_SPECIFIED) else ""})
    return {"framework": {"name": "Model Openness Framework", "version": MOF_VERSION, "date": MOF_DATE},
            "release": {"name": meta["model_name"], "version": str(meta["version"]), "date": str(meta["date"]),
                        "type": "language", "architecture": "transformer decoder", "treatment": "pre-trained",
                        "origin": meta.get("origin", meta["model_name"]), "producer": meta.get("producer", NR),
                        "contact": meta.get("contact", NR), "components": components}}


def _accepted(licenses_json: Path | None) -> dict[str, set[str]]:
    if licenses_json is None or not Path(licenses_json).is_file():
        return OPEN_LICENSES
    out: dict[str, set[str]] = {"code": set(), "data": set(), "document": set()}
    for lic in json.loads(Path(licenses_json).read_text())["licenses"]:
        types = lic.get("ContentType", [])
        for t in [types] if isinstance(types, str) else types:
            out.setdefault(t, set()).add(lic["licenseId"])
    return out


def mof_class(mof_dict: dict[str, Any], licenses_json: Path | None = None) -> str:
    """The MOF class a release reaches: every required component of the class and the classes below
    it included and open under a licence accepted for its content type; else "Unclassified"."""
    accepted = _accepted(licenses_json)
    given = {x["name"]: x["license_name"] for x in mof_dict["release"]["components"]}

    def is_open(name: str) -> bool:
        ids = [p.strip("() ") for p in given.get(name, NOT_INCLUDED).split(" AND ")]
        types = MOF_COMPONENTS[name][2]
        return all(any(i in accepted.get(t, ()) for t in types) for i in ids)

    reached = "Unclassified"
    for cls in (3, 2, 1):
        needed = [n for n, (k, req, _) in MOF_COMPONENTS.items() if req and k >= cls]
        if not all(is_open(n) for n in needed):
            break
        reached = MOF_CLASSES[cls]
    return reached
