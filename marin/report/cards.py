"""The report in the shapes others read: a Hugging Face model card and a datasheet (Gebru et
al. 2021); the FMTI disclosure CSV and the Model Openness Framework file are in
``marin.report.fmti`` and ``marin.report.mof``.

Every value comes from ``facts`` (see ``marin.report.facts``); Markdown cites a fact as a link
``[text](report.md#appendix-sources "fact F<n>")``: to the report's Sources heading, an anchor that
the Hub and GitHub render (they drop the ``<a id>`` of each row), the fact's id in the title. What
the records do not hold is written "not recorded".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from huggingface_hub import CardData, DatasetCard, DatasetCardData, EvalResult, ModelCard, ModelCardData

from marin.export.card import METRICS, Measure, hf_license, metadata, model_index
from marin.report import budget, harness_section, people, references_section, usage
from marin.report.facts import md_escape

NR = "not recorded"
SOURCES = "report.md#appendix-sources"  # the heading `## Appendix: Sources` of report.md, as Markdown anchors it


@dataclass(frozen=True)
class Ctx:
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
        return f'[{md_escape(text)}]({SOURCES} "fact {fid}")'

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


def licence_names(c: Ctx, fids: Iterable[str]) -> str:
    names = sorted({str(c.facts[f]["value"]) for f in fids if f in c.facts})
    return " AND ".join(names) if names else ""


def _sources(c: Ctx) -> list[str]:
    return [s["name"] for s in c.doc["data"]["sources"]]


def verification(c: Ctx, stage: str) -> str | None:
    return next((v["result"] for v in c.doc["verification"] if v["stage"] == stage and v["result"]), None)


# ---------------------------------------------------------------- model card


def _to_yaml(data: CardData) -> str:
    return data.to_yaml()  # pyright: ignore[reportUnknownMemberType]  # huggingface_hub leaves line_break unannotated


def card_data(c: Ctx, extra_results: Iterable[EvalResult] = (), base_model: str | None = None) -> ModelCardData:
    """The card's metadata (``marin.export.card.metadata``, as the export's card): licence, language,
    datasets (the sources' Hub ids, where given), library, ``model-index``: the evaluate run's validation bits
    per byte and perplexity of the model per corpus, then ``extra_results`` (a benchmark harness's, say)."""
    rows = [r for r in (c.evaluation or {}).get("rows", []) if r["name"] == "model"]
    measures = [Measure(r["split"], r["corpus"], k, c.facts[r[k]]["value"]) for r in rows for k in METRICS]
    results = model_index(_sources(c), measures, [*extra_results, *harness_section.eval_results(c.doc, c.facts)])
    return metadata(c.meta, list(c.doc["data"].get("hub_datasets") or []), results, library=bool(c.doc.get("export")),
                    base_model=base_model)


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows] + [""]


def _sources_table(c: Ctx) -> list[str]:
    return _table(["source", "locator", "licence (the archive's)", "texts' own licence", "archive digest", "bytes"],
                  ([f"`{s['name']}`", c.md(s["locator"]), c.md(s["license"]),
                    c.md(s["text_license"]) if s.get("text_license") else "the same", c.md(s["digest"]),
                    c.md(s["bytes"])] for s in c.doc["data"]["sources"]))


def _splits_table(c: Ctx) -> list[str]:
    rows: list[list[str]] = []
    for sp, v in c.doc["data"]["splits"].items():
        for name, x in [("all", v), *((f"`{k}`", x) for k, x in v["corpora"].items())]:
            rows.append([sp, name, c.md(x["docs"]), c.md(x["tokens"]), c.md(x["bytes"])])
    return _table(["split", "corpus", "documents", "tokens", "bytes"], rows)


def model_card(facts: dict[str, Any], doc: dict[str, Any], meta: dict[str, Any]) -> str:
    """A Hugging Face model card (README.md with YAML metadata) built with huggingface_hub."""
    c = Ctx(facts, doc, meta)
    body = _card_body(c)
    card = ModelCard("---\n" + _to_yaml(card_data(c)) + "\n---\n\n" + body)  # parsed back by the Hub's parser
    return str(card.content)


def _card_body(c: Ctx) -> str:
    doc, meta, md = c.doc, c.meta, c.md
    m, d, tr, env = doc["model"], doc["data"], doc["training"], doc["environment"]
    name = meta["model_name"]
    out = [f"# {name}", "",
           f"{name} is a decoder-only transformer language model (Llama architecture) trained from scratch by the "
           "marin pipeline. Every value below links to the ledger record it was read from, listed in the "
           "[technical report](report.md); the training data is described in the [datasheet](datasheet.md).", ""]
    out += usage.how_to_use(md, doc)
    out += ["## Model details", "",
            f"- Authors: {', '.join(meta.get('authors') or []) or NR}; contact: {meta.get('contact') or NR}",
            f"- Funding: {meta.get('funding') or NR}",
            f"- Parameters: {md(m['n_params'])}; optimizer steps: {md(m['steps'])}",
            f"- Weights: `{m['path']}`; tensor digest {md(m['tensor_digest'])} (sha256 over the tensors: the "
            f"model's identity in any file format); folder digest {md(m['folder_digest'])} (sha256 of the folder's "
            "file list: what the ledger and DVC track)",
            f"- Train recipe digest: {md(m['recipe_digest'])}",
            f"- Tokenizer: {md(d['tokenizer']['type'])}, vocabulary {md(d['tokenizer']['vocab_size'])}, "
            f"digest {md(d['tokenizer']['digest'])}",
            "- Frameworks: " + ", ".join(f"{n} {md(f)}" for n, f in c.packages(("jax", "flax", "optax"))),
            f"- Licence: {meta['license']}", "", "Architecture (the train run's model configuration):", ""]
    out += _table(["setting", "value"], ([f"`{k}`", md(f)] for k, f in m["architecture"].items()))
    out += usage.uses(md, doc)
    out += ["## Training data", ""]
    out += _sources_table(c)
    out += _splits_table(c)
    out += ["Curation (filters, deduplication) per corpus is in the [datasheet](datasheet.md).", "",
            "## Training procedure", "", "Hyperparameters:", ""]
    out += _table(["hyperparameter", "value"], ([f"`{k}`", md(f)] for k, f in tr["hyperparameters"].items()))
    s = tr["seeds"]
    cp = doc["compute"]
    out += [f"Seeds: root {md(s['root'])}; each stream is derived as {md(s['derivation'])}: "
            + ", ".join(f"`{n}` {md(f)}" for n, f in s["streams"].items()), "",
            f"Compute: {md(tr['tokens_seen'])} tokens seen (steps × batch size × sequence length); "
            f"{md(tr['flops'])} FLOPs (estimate 6 × parameters × tokens); wall time {md(tr['wall_s'])} s "
            f"on {md(env['determinism_class'].get('device_count'))} {md(env['determinism_class'].get('backend'))} "
            f"device(s), CPU {md(env['env']['cpu_model'])}, cores {md(env['env']['cores_used'])}; "
            f"{md(cp['cpu_hours'])} CPU-hours over the runs behind the model (energy and CO2 "
            "estimate: Compute in the [technical report](report.md)).", "", budget.compute_line(md, doc), ""]
    if "final_loss" in tr:
        out += [f"Final training loss {md(tr['final_loss'])} at step {md(tr['final_step'])}.", ""]
    out += _evaluation(c)
    out += _reproducibility(c)
    out += ["## Citation and licence", "", "```bibtex", people.bibtex(meta), "```", "",
            f"Weights and this card: {meta['license']}; code: {meta.get('code_license', NR)}. The technical report "
            f"is `{meta['report_dir']}/report.md`.", ""]
    return "\n".join(out)


def _evaluation(c: Ctx) -> list[str]:
    md, ev = c.md, c.evaluation
    out = ["## Evaluation", ""]
    if not ev or not ev["rows"]:
        return [*out, f"Evaluation: {NR}.", ""]
    out += ["Bits per byte and perplexity on the held-out validation split, beside a unigram baseline "
            "fitted on the training split and scored on the same tokens.", ""]
    out += _table(["model", "corpus", "bits per byte", "perplexity", "tokens"],
                  ([f"`{r['name']}`", f"`{r['corpus']}`", md(r["bits_per_byte"]), md(r["perplexity"]),
                    md(r["tokens"])] for r in ev["rows"]))
    base = {r["corpus"]: r for r in ev["rows"] if r["name"] == "unigram_baseline"}
    for r in [r for r in ev["rows"] if r["name"] == "model" and r["corpus"] in base]:
        b = base[r["corpus"]]
        mv, bv = c.facts[r["bits_per_byte"]]["value"], c.facts[b["bits_per_byte"]]["value"]
        rel = "above (worse than)" if mv > bv else "equal to" if mv == bv else "below (better than)"
        out += [f"- On `{r['corpus']}` the model's bits per byte {md(r['bits_per_byte'])} is {rel} the unigram "
                f"baseline's {md(b['bits_per_byte'])}."]
    out += [""]
    if ev["samples"]:
        out += ["Greedy completions of the prompts " + ", ".join(md(x["prompt"]) for x in ev["samples"])
                + " are listed in the [technical report](report.md).", ""]
    # the benchmarks, marked against their baselines, then the reference models on the same requests
    return out + harness_section.benchmarks(md, c.doc) + references_section.compared(md, c.doc)


def _reproducibility(c: Ctx) -> list[str]:
    md, doc = c.md, c.doc
    out = ["## Reproducibility", "", "Ledger runs behind this card (the model's lineage, and the evaluation, export "
           "and instruct runs that read the model, with theirs) and their re-execution by `marin verify`:", ""]
    out += _table(["stage", "run", "verification", "mode", "verified at"],
                  ([v["stage"], f"`{v['run_id']}`", md(v["result"]) if v["result"] else "no verification recorded",
                    md(v.get("mode")), md(v.get("when"))] for v in doc["verification"]))
    code = doc["environment"]["code"]
    return [*out, f"Code: git commit {md(code['git_commit'])}, code digest {md(code['code_digest'])}, lock file "
                  f"digest {md(code['lock_digest'])}; determinism class digest "
                  f"{md(doc['environment']['determinism_digest'])}.", "",
                  "To reproduce: check out that commit, run `dvc repro`, then `marin verify models/final --upstream`.",
                  ""]


# ---------------------------------------------------------------- datasheet


def _distribution(remote: dict[str, str] | None) -> str:
    """Where the data is, as the project's DVC config says when the report was built."""
    if remote:
        return (f"- Distributed through the DVC remote `{remote['name']}` (`{remote['url']}`): `marin publish` "
                "uploads it with the model and checkpoints, `dvc pull` fetches it; under the licences of its sources: ")
    return ("- Not distributed: the data (`data/`, tracked by DVC) stays on the machine that ran the pipeline, as "
            "no DVC remote is configured; each source can be fetched again from its recorded locator, under the "
            "licences of its sources: ")


def _dataset_data(c: Ctx) -> DatasetCardData:
    """The datasheet's Hub metadata: the sources' licences, task, name."""
    lics = sorted({str(c.facts[s["license"]]["value"]) for s in c.doc["data"]["sources"] if s["license"] in c.facts})
    ids = sorted({hf_license(x) for x in lics})
    return DatasetCardData(license=ids if len(ids) > 1 else (ids[0] if ids else "unknown"),
                           license_name=" AND ".join(x for x in lics if hf_license(x) == "other") or None,
                           pretty_name=f"Training data of {c.meta['model_name']}",
                           task_categories=["text-generation"], tags=["marin"])


def _missing(key: str, why: str = "") -> str:
    """What a question's answer lacks, and the params.yaml key that supplies it."""
    return f"{NR}{' (' + why + ')' if why else ''}: state it in params.yaml as `report.{key}`."


def _answer(c: Ctx, key: str, why: str = "") -> str:
    """The answer to a question the ledger holds no fact for: the lab's, from params.yaml
    (``report.datasheet.<key>``, recorded in the report run's params), else what to add where."""
    answers: dict[str, str] = c.meta.get("datasheet") or {}
    answer = answers.get(key)
    return f"{answer} (params.yaml `report.datasheet.{key}`)" if answer else _missing("datasheet." + key, why)


def _stated(c: Ctx, key: str, question: str, why: str = "") -> str:
    return f"- {question}: {_answer(c, key, why)}"


def _redundancies(c: Ctx) -> str:
    """Redundancies and errors, from the curation funnel: documents each deduplication step and each
    filter removed; missing information is the lab's to state."""
    removed = [(f["corpus"], step, r) for f in c.doc["data"]["funnel"] for step, r in f["removed"].items()]
    dups = [f"{c.md(r['docs'])} in `{corpus}` by `{step}`" for corpus, step, r in removed if "dedup" in step]
    bad = [f"{c.md(r['docs'])} in `{corpus}` by `{step}`" for corpus, step, r in removed if "dedup" not in step]
    return ("- Missing information, errors or redundancies: duplicates removed: " + ("; ".join(dups) or "none found")
            + "; documents failing a quality filter removed: " + ("; ".join(bad) or "none") + "; what remains "
            "missing or wrong: " + _answer(c, "missing"))


def datasheet(facts: dict[str, Any], doc: dict[str, Any], meta: dict[str, Any]) -> str:
    """A datasheet for the training data, with the seven sections of Gebru et al. (2021)."""
    c = Ctx(facts, doc, meta)
    fs = f"{doc['data']['filters_source']['run_id']}#{doc['data']['filters_source']['seq']}"
    out = ["---", _to_yaml(_dataset_data(c)), "---", "", f"# Datasheet: training data of {meta['model_name']}", "",
           "Answers to the questions of *Datasheets for Datasets* (Gebru et al., 2021). Every value links to "
           "its ledger record in the [technical report](report.md); what the records do not hold is marked "
           f"\"{NR}\", naming the params.yaml key (`report.datasheet.*`) where the lab states it.", ""]
    out += _motivation_and_composition(c) + _collection(c, fs) + _preprocessing(c, fs) + _uses_onwards(c)
    text = "\n".join(out)
    DatasetCard(text)  # the Hub's parser reads it back (a malformed header raises here, not on the Hub)
    return text


def _motivation_and_composition(c: Ctx) -> list[str]:
    meta = c.meta
    out = ["## Motivation", "",
           f"- Purpose: to pre-train and evaluate the language model {meta['model_name']} with the marin pipeline.",
           "- Who created the dataset, on whose behalf: "
           + (f"{', '.join(meta['authors'])}, curating the sources below with the marin pipeline."
              if meta.get("authors") else _missing("authors")),
           f"- Funding: {meta.get('funding') or _missing('funding')}", "",
           "## Composition", "",
           "- Instances: text documents, each from one corpus of a source; no labels or targets.",
           "- Sources (the data is a curated subset of them):", ""]
    out += _sources_table(c)
    out += ["- Splits, recommended as they are (validation is held out from training):", ""]
    out += _splits_table(c)
    out += [_redundancies(c),
            _stated(c, "sensitive_content", "Confidential data, personal information, offensive content",
                    "no filter of the pipeline looks for them"),
            _stated(c, "identifiable_people", "Sub-populations or individuals identifiable"), ""]
    return out


def _collection(c: Ctx, fs: str) -> list[str]:
    return ["## Collection process", "",
            "- Acquisition: each source archive was fetched from its locator and checked against its pinned "
            f"digest by the fetch run `{c.doc['lineage'][0]['run_id']}` (table above).",
            "- Sampling strategy: of each source archive, the members its extraction rules select (below; "
            f"the curate run's parameters, `{fs}` at `/body/params/fetch/sources`), each taken whole; the validation "
            f"split is a salted hash split (`{fs}` at `/body/params/curate/split`).",
            *_extraction_rules(c),
            _stated(c, "collectors", "Who collected the data and how they were compensated"),
            _stated(c, "time_frame", "Time frame of the data's creation", "the ledger records when it was "
                    "fetched, not when its documents were written"),
            _stated(c, "ethical_review", "Ethical review, notice and consent of the people in the data"), ""]


def _extraction_rules(c: Ctx) -> list[str]:
    """One line per corpus of each source: the archive members it takes and leaves."""
    out: list[str] = []
    for source, rules in c.doc["data"].get("extract", {}).items():
        for r in rules:
            left = f"; excluded: {', '.join(f'`{g}`' for g in r['exclude'])}" if r["exclude"] else ""
            out.append(f"  - `{source}` → corpus `{r['corpus']}`: members matching "
                       f"{', '.join(f'`{g}`' for g in r['include'])}{left}; every other member is left out")
    return out


def _preprocessing(c: Ctx, fs: str) -> list[str]:
    d, md = c.doc["data"], c.md
    out = ["## Preprocessing/cleaning/labeling", "",
           "Curation funnel per corpus (documents and bytes in, removed by each filter, kept):", ""]
    for f in d["funnel"]:
        raw = f" ({md(f['kept_raw_bytes'])} as read)" if f.get("kept_raw_bytes") else ""
        out += [f"- `{f['corpus']}` (licence {md(f['license'])}): in {md(f['in_docs'])} documents / "
                f"{md(f['in_bytes'])} bytes; kept {md(f['kept_docs'])} / {md(f['kept_bytes'])} bytes stored, "
                f"stripped and normalized{raw}"]
        out += [f"  - removed by `{step}`: {md(r['docs'])} documents, {md(r['bytes'])} bytes"
                for step, r in f["removed"].items()] or ["  - no document removed"]
    filters = ", ".join(f"`{k}`" for k in d["curate_params"].get("filters", {})) or NR
    tok = d["tokenizer"]
    out += ["", f"- Filters configured: {filters}; their thresholds, the normalisation and the deduplication "
            f"settings are in the curate run's parameters (`{fs}` at `/body/params/curate`).",
            f"- Tokenization: {md(tok['type'])}, vocabulary {md(tok['vocab_size'])}, tokenizer digest "
            f"{md(tok['digest'])}.",
            "- Labeling: none.",
            "- Raw data kept: yes, `data/raw` (fetch output); curated text in `data/curated`, tokens in "
            "`data/tokens`. Software: `marin/data`, `pipeline/`.", ""]
    return out


def _uses_onwards(c: Ctx) -> list[str]:
    """Uses, distribution and maintenance."""
    meta, ev = c.meta, c.evaluation
    return ["## Uses", "",
            f"- Used for: training {meta['model_name']}"
            + (f"; its validation split for the evaluation in run `{ev['run_id']}`." if ev else "."),
            _stated(c, "other_uses", "Other tasks it could be used for, and tasks it should not be used for"),
            _stated(c, "impacts", "Impacts of its composition on future uses"), "",
            "## Distribution", "",
            _distribution(meta.get("data_remote"))
            + ", ".join(f"`{s['name']}` {c.md(s['license'])}" for s in c.doc["data"]["sources"]) + ".",
            _stated(c, "ip_restrictions", "Third-party IP restrictions or export controls", "beyond the licences "
                    "above"), "",
            "## Maintenance", "",
            f"- Maintainer and contact: {meta.get('contact') or _missing('contact')}",
            _stated(c, "erratum", "Erratum"),
            "- Updates: a change is a new ledger run of the pipeline; every run is kept in `ledger/runs`.",
            _stated(c, "retention", "Retention limits, and how others may contribute"), ""]
