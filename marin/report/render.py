"""report.md and a self-contained report.html (inline SVG plots) from the gathered facts.

Every value printed is a fact, rendered as a link to its entry under "Sources", which
names the run, the record's seq and digest and the JSON pointer. Rendering is a pure
function of the facts: the same ledger gives the same bytes (plots included: matplotlib's
SVG ids are salted with a constant and the date is left out).
"""

from __future__ import annotations

import html
import io
import re
from collections.abc import Callable
from typing import Any

from marin import hashing
from marin.export import energy
from marin.report import (
    budget,
    experiments,
    harness_section,
    instruct,
    memorisation,
    proves,
    references_section,
    verifications,
)
from marin.report.facts import Fact, md_escape

CURVES = (("loss", "Loss"), ("lr", "Learning rate"), ("grad_norm", "Gradient norm (before clipping)"))


class Doc:
    """Markdown built line by line; ``v(id)`` prints a fact as a link to its source."""

    def __init__(self, facts: dict[str, Fact], link_prefix: str = ""):
        self.facts, self.prefix, self.lines = facts, link_prefix, []

    def v(self, fid: str | None) -> str:
        if fid is None:
            return "not recorded"
        f = self.facts[fid]
        return f"[{md_escape(f.text)}]({self.prefix}#{fid})"

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def table(self, head: list[str], rows: list[list[str]]) -> None:
        self.add("| " + " | ".join(head) + " |", "|" + "---|" * len(head))
        self.add(*("| " + " | ".join(r) + " |" for r in rows))
        self.add("")

    def text(self) -> str:
        return "\n".join(self.lines).rstrip() + "\n"


def figure_svg(curve: dict[str, Any], key: str, title: str) -> str:
    """One training curve as SVG text, deterministic for the same values; the loss figure
    shows the validation loss beside the training loss."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"svg.hashsalt": "marin-report", "svg.fonttype": "path", "font.size": 9}):
        fig, ax = plt.subplots(figsize=(6.0, 2.6), dpi=100)
        ax.plot(curve["step"], curve[key], color="#d62728", linewidth=1.6, label="training")
        val = [(s, v) for s, v in zip(curve["step"], curve.get("val_loss") or [], strict=False) if v is not None]
        if key == "loss" and val:
            ax.plot([s for s, _ in val], [v for _, v in val], color="#1f77b4", linewidth=1.6, label="validation")
            ax.legend(frameon=False)
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "marin report"})
        plt.close(fig)
    return buf.getvalue()


def figure_source(curve: dict[str, Any]) -> str:
    """Digest over the metric records a figure plots (their record digests, in order)."""
    return hashing.json_digest([r["digest"] for r in curve["records"]])


def short(digest: str, n: int = 12) -> str:
    """A digest as its first ``n`` hex digits, the whole digest on hover (report.json has it too)."""
    hexpart = digest.split(":", 1)[-1]
    return f'<code title="{html.escape(digest)}">{hexpart[:n]}</code>'


def markdown(facts: dict[str, Fact], doc: dict[str, Any], meta: dict[str, Any]) -> str:
    """report.md: summary, how to use, uses and risks, data, training, compute, evaluation,
    environment, verification, lineage, people and citation, sources."""
    d = Doc(facts)
    m, tr = doc["model"], doc["training"]
    d.add(f"# Transparency report: {meta['model_name']} {meta['version']}", "",
          f"By {_authors(meta)}. Built by `marin report` from the ledger alone: every number links to the ledger "
          "record it came from (see [Sources](#sources)), and `marin report verify` re-derives all of them and "
          "checks the in-toto provenance (`provenance.intoto.json`) and, when it is signed, its signature.", "")
    d.add("## Summary", "",
          f"A decoder-only transformer (Llama architecture) with {d.v(m['n_params'])} parameters, trained from "
          f"scratch for {d.v(m['steps'])} optimizer steps on {d.v(tr['tokens_seen'])} tokens. Weights: `{m['path']}`"
          f", tensor digest {d.v(m['tensor_digest'])}; train recipe {d.v(m['recipe_digest'])}.", "",
          "The model has two digests. The **tensor digest** is the sha256 over its tensors (names, dtypes, "
          "shapes, bytes): the model's identity, the same in every file format, and the subject of the signed "
          f"provenance. The **folder digest** {d.v(m['folder_digest'])} is the sha256 of the list of files in "
          f"`{m['path']}`: what the ledger, `marin lineage` and DVC track.", "")
    d.add(*how_to_use(d.v, doc), *uses(d.v, doc))
    _data(d, doc)
    _training(d, doc)
    _compute(d, doc, meta)
    _evaluation(d, doc)
    d.add(*harness_section.lines(d.v, doc))
    d.add(*references_section.lines(d.v, doc))
    d.add(*experiments.lines(d.v, doc))
    _environment(d, doc)
    d.add(*proves.lines(d.v, doc), *verifications.lines(d.v, doc, facts))
    d.add(*instruct.lines(d.v, doc))
    d.add(*memorisation.lines(d.v, doc))
    _lineage(d, doc)
    _people(d, meta)
    _sources(d, facts, tr["curve"])
    return d.text()


def _authors(meta: dict[str, Any]) -> str:
    return ", ".join(meta.get("authors") or []) or "authors not recorded"


def how_to_use(v: Callable[[str | None], str], doc: dict[str, Any], level: str = "##") -> list[str]:
    """The "How to use" section: the three lines that load the Hugging Face export."""
    ex = doc.get("export")
    out = [f"{level} How to use", ""]
    if ex is None:
        return [*out, "No Hugging Face export of this model is recorded: run `dvc repro export`, then `marin report`.",
                ""]
    return [*out, f"`{ex['path']}` (export run `{ex['run_id']}`, folder digest {v(ex['digest'])}, tensor digest "
            f"{v(ex['tensor_digest'])}) is a Llama checkpoint with its tokenizer that `transformers` loads:", "",
            "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
            f'model = AutoModelForCausalLM.from_pretrained("{ex["path"]}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{ex["path"]}")', "```", "",
            "Then `model.generate(**tokenizer(\"ROMEO.\", return_tensors=\"pt\"), max_new_tokens=40, "
            "do_sample=False)` continues a text greedily, as the evaluate stage's samples do: documents followed "
            "the end-of-text token in training, so the tokenizer starts every text with it (as "
            "`pipeline(\"text-generation\")` does too). The export's README.md (its model card) prints such a "
            "sample.", ""]


def uses(v: Callable[[str | None], str], doc: dict[str, Any], level: str = "##") -> list[str]:
    """Intended use, limitations and risks, written as such (the results are under Evaluation)."""
    m, tr = doc["model"], doc["training"]
    return [
        f"{level} Intended use", "",
        "Research and teaching on reproducible language-model training: a complete, small pipeline whose every "
        "number can be re-derived from its ledger and whose runs can be replayed bit for bit (`marin verify`) "
        "on the CPUs, layout and threads the report's \"What verification proves\" names. A baseline to compare "
        "data, training or provenance changes against.", "",
        "Out of scope: any use that relies on the generated text being correct, safe or fluent: chat, advice, "
        "content for publication, decisions about people.", "",
        f"{level} Limitations", "",
        f"- Scale: {v(m['n_params'])} parameters trained on {v(tr['tokens_seen'])} token positions. It "
        "continues text in the style of its training data and does not follow instructions or answer "
        "questions reliably.",
        f"- Context: at most {v(m['architecture'].get('seq_len'))} tokens; longer inputs are not supported.",
        "- Language and domain: those of the training sources (see Data); other languages, registers and "
        "domains are out of distribution.",
        _evaluation_limits(doc), "",
        f"{level} Risks", "",
        "- The training texts carry the views of their authors and their time; generated text can repeat them. "
        "Nothing was filtered for harmful content.",
        "- A model this small produces fluent-looking but wrong or meaningless text; do not present its output "
        "as fact.",
        budget.memorisation_risk(v, doc), ""]


def _evaluation_limits(doc: dict[str, Any]) -> str:
    """What was evaluated, from the sections the report holds: all of it on held-out data of the same sources."""
    done = ["bits per byte on the validation split"]
    if (doc.get("harness") or {}).get("rows"):  # no count here: every number of a card is a cited fact
        done.append("lm-evaluation-harness tasks whose data is cut from that split")
    if doc.get("instruct"):
        done.append("the instruct model's answers to held-out instructions from it")
    return (f"- Evaluation: only on held-out data of the same sources ({'; '.join(done)}); no evaluation of "
            "knowledge, reasoning, bias, toxicity or memorisation on other data was run.")


def _data(d: Doc, doc: dict[str, Any]) -> None:
    data = doc["data"]
    d.add("## Data", "", "### Sources", "")
    d.table(["source", "locator", "license", "archive digest", "bytes"],
            [[s["name"], d.v(s["locator"]), d.v(s["license"]), d.v(s["digest"]), d.v(s["bytes"])]
             for s in data["sources"]])
    notes = data.get("license_notes") or {}
    if notes:  # the attribution a licence asks for (CC BY), as params.yaml's license_note states it
        d.add("Licence notes and attribution (`fetch.sources[].license_note` in the curate run's parameters):", "",
              *(f"- `{name}`: {md_escape(note)}" for name, note in notes.items()), "")
    d.add("### Curation funnel", "", "Documents and bytes removed by each step (steps that removed nothing "
          "are left out). Bytes are as read from the archive up to the kept documents; what is stored is their "
          "text with the leading and trailing whitespace stripped and Unicode-normalized (the last row).", "")
    rows = []
    for c in data["funnel"]:
        rows.append([c["corpus"], "in", d.v(c["in_docs"]), d.v(c["in_bytes"])])
        rows += [[c["corpus"], f"removed by {step}", d.v(r["docs"]), d.v(r["bytes"])]
                 for step, r in c["removed"].items()]
        if c.get("kept_raw_bytes"):
            rows.append([c["corpus"], "kept, as read", d.v(c["kept_docs"]), d.v(c["kept_raw_bytes"])])
        rows.append([c["corpus"], "kept, stored (stripped, normalized)", d.v(c["kept_docs"]), d.v(c["kept_bytes"])])
    d.table(["corpus", "step", "documents", "bytes"], rows)
    d.add("### Composition", "")
    d.table(["split", "corpus", "license", "documents", "tokens", "bytes"],
            [[split, c, d.v(_license(data, c)), d.v(x["docs"]), d.v(x["tokens"]), d.v(x["bytes"])]
             for split, sp in data["splits"].items() for c, x in sp["corpora"].items()]
            + [[split, "all", "", d.v(sp["docs"]), d.v(sp["tokens"]), d.v(sp["bytes"])]
               for split, sp in data["splits"].items()])
    tok = data["tokenizer"]
    d.add(f"Tokenizer: {d.v(tok['type'])}, vocabulary {d.v(tok['vocab_size'])}, digest {d.v(tok['digest'])}.", "")


def _training(d: Doc, doc: dict[str, Any]) -> None:
    m, tr = doc["model"], doc["training"]
    d.add("## Training", "", "### Architecture and hyperparameters", "")
    arch, hp = list(m["architecture"].items()), list(tr["hyperparameters"].items())
    rows = [[*(arch[i] if i < len(arch) else ("", None)), *(hp[i] if i < len(hp) else ("", None))]
            for i in range(max(len(arch), len(hp)))]
    d.table(["model", "value", "train", "value"],
            [[a, d.v(fa) if a else "", h, d.v(fh) if h else ""] for a, fa, h, fh in rows])  # pyright: ignore[reportArgumentType]
    s = tr["seeds"]
    d.add(f"Seeds: root {d.v(s['root'])}; derivation {d.v(s['derivation'])}; streams "
          + ", ".join(f"`{n}` {d.v(fid)}" for n, fid in s["streams"].items()) + ".", "")
    d.add("### Training curves", "")
    c = tr["curve"]
    for key, title in CURVES:
        what = "training loss and, in blue, the validation loss on a fixed batch of validation windows" \
            if key == "loss" and any(v is not None for v in c.get("val_loss", [])) else title.lower()
        d.add(f"![{title}](figures/{key}.svg)", "",
              f"*{what[0].upper() + what[1:]}: the {len(c['step'])} metric records of run `{c['run_id']}` "
              f"([figure source](#figure-{key})).*", "")
    if "final_loss" in tr:
        d.add(f"Final training loss {d.v(tr['final_loss'])} at step {d.v(tr['final_step'])}.", "")


def _compute(d: Doc, doc: dict[str, Any], meta: dict[str, Any]) -> None:
    tr, env, det, cp = doc["training"], doc["environment"]["env"], doc["environment"]["determinism_class"], \
        doc["compute"]
    d.add("## Compute", "")
    gpu = d.v(cp["gpu_hours"]) if cp["gpu_hours"] else "0 (no run used a GPU)"
    d.table(["quantity", "value"], [
        ["tokens seen (steps × batch × sequence length)", d.v(tr["tokens_seen"])],
        ["training FLOPs (6·N·D estimate)", d.v(tr["flops"])], ["train wall time (s)", d.v(tr["wall_s"])],
        [f"CPU-hours, the {cp['runs']} runs behind this report (wall time × usable cores)", d.v(cp["cpu_hours"])],
        ["GPU-hours (wall time × devices)", gpu],
        ["hardware", f"{d.v(env['cpu_model'])}, {d.v(env['cpu_count'])} cores ({d.v(env['machine'])})"],
        ["cores usable by the train run", d.v(env["cores_used"])],
        ["XLA CPU threads, devices", f"{d.v(det.get('xla_cpu_threads'))}, {d.v(det.get('device_count'))}"]])
    d.add(budget.compute_line(d.v, doc), "", budget.WALL_TIME_SCOPE, "")
    e = meta.get("energy")
    estimate = energy.compute_energy(lambda fid: d.facts[fid].value, cp, e)
    if estimate is None or e is None:
        d.add("Energy and CO2: not estimated (no `report.energy` assumptions in params.yaml).", "")
        return
    d.add(f"**Estimate** (not a measurement): {energy.kwh_text(estimate[0])} and {energy.co2_text(estimate[1])}, as "
          f"(CPU-hours × {e['cpu_watts_per_core']:g} W per core + GPU-hours × {e['gpu_watts']:g} W per GPU) × PUE "
          f"{e['pue']:g} × {e['kg_co2e_per_kwh']:g} kg CO2e per kWh. The power draws, the data-centre overhead "
          "(PUE) and the grid's carbon intensity are assumptions from `params.yaml: report.energy`, not "
          "readings of this machine; the hours are from the ledger's wall times.", "")


def _evaluation(d: Doc, doc: dict[str, Any]) -> None:
    ev = doc["evaluation"]
    d.add("## Evaluation", "")
    if ev is None:
        d.add("not recorded: no evaluate run read this model", "")
        return
    d.add(f"Validation split, evaluate run `{ev['run_id']}`. Bits per byte normalise by UTF-8 bytes, so they "
          "compare across tokenizers; the unigram baseline is scored on the same tokens.", "")
    d.table(["scorer", "corpus", "bits per byte", "perplexity", "tokens"],
            [[r["name"], r["corpus"], d.v(r["bits_per_byte"]), d.v(r["perplexity"]), d.v(r["tokens"])]
             for r in ev["rows"]])
    if ev["samples"]:
        d.add("Greedy samples:", "")
        d.table(["prompt", "completion"], [[d.v(x["prompt"]), d.v(x["completion"])] for x in ev["samples"]])


def _environment(d: Doc, doc: dict[str, Any]) -> None:
    e = doc["environment"]
    d.add("## Environment and determinism class", "")
    d.table(["", "value"], [[k, d.v(fid)] for k, fid in {**e["env"], **e["determinism_class"], **e["code"]}.items()]
            + [["determinism class digest", d.v(e["determinism_digest"])],
               ["packages", ", ".join(f"{k} {d.v(fid)}" for k, fid in e["packages"].items())]])
    d.add("## Verification status", "", "For each run behind this report (Lineage, below), the latest full replay by "
          "`marin verify` (else the latest segment replay: K of N checkpoint intervals, which catches one "
          "forged interval with probability K/N), and how many verifications the ledger holds.", "")
    d.table(["stage", "run", "result", "mode", "when", "verifier CPU", "verifier cores", "verifications"],
            [[v["stage"], f"`{v['run_id']}`", d.v(v["result"]), _mode(d, v), d.v(v.get("when")),
              d.v(v.get("where")), d.v(v.get("cores")), str(v.get("verifications", 0))] if v["result"] else
             [v["stage"], f"`{v['run_id']}`", "not verified", "", "", "", "", "0"] for v in doc["verification"]])


def _lineage(d: Doc, doc: dict[str, Any]) -> None:
    d.add("## Lineage", "", "The runs behind this report: the model's own lineage, the evaluation, export and "
          "instruct runs that read the model, and the runs behind those (W3C PROV-JSON: `lineage.prov.json`).", "")
    d.table(["stage", "run", "status", "recipe digest", "git commit"],
            [[r["stage"], f"`{r['run_id']}`", r["status"], short(r["recipe_digest"]),
              short(r["git_commit"] or "?")] for r in doc["lineage"]])


def bibtex(meta: dict[str, Any]) -> str:
    """A BibTeX entry for the model and its report."""
    key = re.sub(r"[^A-Za-z0-9]", "", meta["model_name"]) + meta.get("date", "")[:4]
    fields = [("title", f"{meta['model_name']} {meta['version']}: a reproducible language model and its "
                        "transparency report"),
              ("author", " and ".join("{" + a + "}" for a in meta.get("authors") or []) or "{not recorded}"),
              ("year", meta.get("date", "")[:4]), ("version", meta["version"]),
              ("note", f"Model tensor digest {meta['model_tensor_digest']}" if meta.get("model_tensor_digest")
               else "Transparency report built by marin"),
              *([("url", meta["url"])] if meta.get("url") else [])]
    return "@misc{" + key + ",\n" + ",\n".join(f"  {k} = {{{v}}}" for k, v in fields) + "\n}"


def _people(d: Doc, meta: dict[str, Any]) -> None:
    d.add("## Authors, contact, funding", "", f"- Authors: {_authors(meta)}",
          f"- Contact: {meta.get('contact') or 'not recorded'}", f"- Funding: {meta.get('funding') or 'not recorded'}",
          f"- Licences: weights {meta['license']}, code {meta.get('code_license', 'not recorded')}", "")
    d.add("## Citation", "", "```bibtex", bibtex(meta), "```", "",
          "The project's own citation metadata is `CITATION.cff` at the root of its repository.", "")


def _sources(d: Doc, facts: dict[str, Fact], c: dict[str, Any]) -> None:
    # a plain heading: its anchor, #appendix-sources, is the one the Hub and GitHub make (cards link to it)
    d.add('<a id="sources"></a>', "", "## Appendix: Sources", "",
          "Each fact: the ledger run and record (seq; the record's digest, shortened: hover for all of it, "
          "report.json holds every digest in full) and the JSON pointer to the value, in the record or in a "
          "recorded output file; derived values name their formula.", "")
    rows = []
    for f in facts.values():
        src = f.source
        if "formula" in src:
            where = f"{src['formula']} of " + ", ".join(f"[{i}](#{i})" for i in src["inputs"])
            rows.append([f'<a id="{f.id}"></a>{f.id}', md_escape(f.label), "derived", where])
        elif "vsa" in src:  # a signed verification summary: the file, its digest, the pointer into its statement
            rows.append([f'<a id="{f.id}"></a>{f.id}', md_escape(f.label),
                         f"`{src['vsa']}` {short(src['file_digest'], 8)}", f"statement `{src['pointer']}`"])
        else:
            ptr = f"`{src['file']}` {short(src['file_digest'], 8)} `{src['pointer']}`" if "file" in src \
                else f"`{src['pointer']}`"
            rows.append([f'<a id="{f.id}"></a>{f.id}', md_escape(f.label),
                         f"`{src['run_id']}` seq {src['seq']} {short(src['record'], 8)}", ptr])
    d.add('<div class="sources">', "")
    d.table(["fact", "what", "record", "value at"], rows)
    d.add("</div>", "")
    d.add("Figures:", "")
    d.table(["figure", "run", "metric records (seq)", "digest of their record digests"],
            [[f'<a id="figure-{key}"></a>{key}', f"`{c['run_id']}`",
              f"{c['records'][0]['seq']}–{c['records'][-1]['seq']}" if c["records"] else "none",
              short(figure_source(c))] for key, _ in CURVES])


def _mode(d: Doc, v: dict[str, Any]) -> str:
    seg = v.get("segments")
    if not seg:
        return d.v(v.get("mode"))
    return f"{d.v(v['mode'])} {d.v(seg['k'])} of {d.v(seg['n'])} (seed {d.v(seg.get('seed_source'))})"


def _license(data: dict[str, Any], corpus: str) -> str | None:
    return next((c["license"] for c in data["funnel"] if c["corpus"] == corpus), None)


STYLE = """body{font-family:system-ui,-apple-system,'DejaVu Sans',sans-serif;max-width:1180px;margin:2em auto;
padding:0 1em;color:#1b1b1b;line-height:1.45}table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.86em;
display:block;max-width:100%;overflow-x:auto}pre{overflow-x:auto;background:#f5f7fa;padding:.6em}
td,th{border:1px solid #ccd;padding:.25em .5em;text-align:left;vertical-align:top}th{background:#eef2f8}
code{font-size:.9em;word-break:break-all}a{color:#1f5fa8;text-decoration:none}a:hover{text-decoration:underline}
figure{margin:0}svg{max-width:100%;height:auto}h1{font-size:1.6em}h2{border-bottom:1px solid #ccd}
.sources table{font-size:.74em}.sources td{padding:.1em .4em}.sources code{word-break:normal}
.sources td:nth-child(-n+3){white-space:nowrap}
figure.plot svg{max-width:640px}"""


def html_page(md_text: str, facts: dict[str, Fact], figures: dict[str, str], title: str) -> str:
    """The Markdown as one self-contained HTML page: figures inline, each fact link titled with its source."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": True}).enable("table").render(md_text)
    for key, svg in figures.items():
        img = f'<img src="figures/{key}.svg" alt="'
        start = body.find(img)
        if start >= 0:
            end = body.index(">", start) + 1
            body = body[:start] + '<figure class="plot">' + svg[svg.index("<svg"):] + "</figure>" + body[end:]
    for f in facts.values():
        src = f.source
        tip = (f"{src['formula']}" if "formula" in src else f"{src['vsa']} {src['file_digest']}" if "vsa" in src
               else f"{src['run_id']} seq {src['seq']} {src['record']}")
        body = body.replace(f'<a href="#{f.id}">', f'<a href="#{f.id}" title="{html.escape(tip)}">')
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f"<style>{STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n")

