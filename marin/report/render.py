"""report.md and a self-contained report.html (inline SVG plots) from the gathered facts.

Every value printed is a fact, rendered as a link to its entry under "Sources", which
names the run, the record's seq and digest and the JSON pointer. Rendering is a pure
function of the facts: the same ledger gives the same bytes (plots included: matplotlib's
SVG ids are salted with a constant and the date is left out).
"""

from __future__ import annotations

import html
import io
from typing import Any

from marin import hashing
from marin.report.facts import Fact, md_escape

CURVES = (("loss", "Training loss"), ("lr", "Learning rate"), ("grad_norm", "Gradient norm (before clipping)"))


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
    """One training curve as SVG text, deterministic for the same values."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"svg.hashsalt": "marin-report", "svg.fonttype": "path", "font.size": 9}):
        fig, ax = plt.subplots(figsize=(6.0, 2.6), dpi=100)
        ax.plot(curve["step"], curve[key], color="#d62728", linewidth=1.6)
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


def markdown(facts: dict[str, Fact], doc: dict[str, Any], meta: dict[str, Any]) -> str:
    """report.md: what was trained, data, training, evaluation, environment, verification, lineage, sources."""
    d = Doc(facts)
    m, data, tr, ev = doc["model"], doc["data"], doc["training"], doc["evaluation"]
    d.add(f"# Transparency report: {meta['model_name']} {meta['version']}", "",
          "Built by `marin report` from the ledger alone. Every number links to the ledger record it came from "
          "(see [Sources](#sources)); `marin report verify` re-derives all of them and checks the in-toto "
          "provenance (`provenance.intoto.json`) and, when it is signed, its signature.", "")
    d.add("## What was trained", "",
          f"A decoder-only transformer with {d.v(m['n_params'])} parameters, trained for {d.v(m['steps'])} "
          f"optimizer steps on {d.v(tr['tokens_seen'])} tokens. Final weights: `{m['path']}`, tensor digest "
          f"{d.v(m['tensor_digest'])}; train recipe {d.v(m['recipe_digest'])}.", "")
    d.table(["architecture", "value"], [[k, d.v(fid)] for k, fid in m["architecture"].items()])

    d.add("## Data", "", "### Sources", "")
    d.table(["source", "locator", "license", "archive digest", "bytes"],
            [[s["name"], d.v(s["locator"]), d.v(s["license"]), d.v(s["digest"]), d.v(s["bytes"])]
             for s in data["sources"]])
    d.add("### Curation funnel", "", "Documents and bytes removed by each step (steps that removed nothing "
          "are left out).", "")
    rows = []
    for c in data["funnel"]:
        rows.append([c["corpus"], "in", d.v(c["in_docs"]), d.v(c["in_bytes"])])
        rows += [[c["corpus"], f"removed by {step}", d.v(r["docs"]), d.v(r["bytes"])]
                 for step, r in c["removed"].items()]
        rows.append([c["corpus"], "kept", d.v(c["kept_docs"]), d.v(c["kept_bytes"])])
    d.table(["corpus", "step", "documents", "bytes"], rows)
    d.add("### Composition", "")
    d.table(["split", "corpus", "license", "documents", "tokens", "bytes"],
            [[split, c, d.v(_license(data, c)), d.v(x["docs"]), d.v(x["tokens"]), d.v(x["bytes"])]
             for split, sp in data["splits"].items() for c, x in sp["corpora"].items()]
            + [[split, "all", "", d.v(sp["docs"]), d.v(sp["tokens"]), d.v(sp["bytes"])]
               for split, sp in data["splits"].items()])
    tok = data["tokenizer"]
    d.add(f"Tokenizer: {d.v(tok['type'])}, vocabulary {d.v(tok['vocab_size'])}, digest {d.v(tok['digest'])}.", "")

    d.add("## Training", "", "### Hyperparameters", "")
    d.table(["train param", "value"], [[k, d.v(fid)] for k, fid in tr["hyperparameters"].items()])
    s = tr["seeds"]
    d.add("### Seeds", "", f"Root seed {d.v(s['root'])}; derivation: {d.v(s['derivation'])}.", "")
    d.table(["stream", "fold_in value"], [[n, d.v(fid)] for n, fid in s["streams"].items()])
    env = doc["environment"]["env"]
    det = doc["environment"]["determinism_class"]
    d.add("### Compute", "")
    d.table(["quantity", "value"], [
        ["tokens seen (steps × batch × sequence length)", d.v(tr["tokens_seen"])],
        ["training FLOPs (6·N·D estimate)", d.v(tr["flops"])], ["train wall time (s)", d.v(tr["wall_s"])],
        ["hardware", f"{d.v(env['cpu_model'])}, {d.v(env['cpu_count'])} cores ({d.v(env['machine'])})"],
        ["cores usable by the run", d.v(env["cores_used"])],
        ["XLA CPU threads", d.v(det.get("xla_cpu_threads"))], ["devices", d.v(det.get("device_count"))]])
    d.add("### Training curves", "")
    for key, title in CURVES:
        d.add(f"![{title}](figures/{key}.svg)", "",
              f"*{title}: the {len(tr['curve']['step'])} metric records of run `{tr['curve']['run_id']}` "
              f"([figure source](#figure-{key})).*", "")
    if "final_loss" in tr:
        d.add(f"Final training loss {d.v(tr['final_loss'])} at step {d.v(tr['final_step'])}.", "")

    d.add("## Evaluation", "")
    if ev is None:
        d.add("not recorded: no evaluate run read this model", "")
    else:
        d.add(f"Validation split, evaluate run `{ev['run_id']}`. Bits per byte normalise by UTF-8 bytes, so they "
              "compare across tokenizers; the unigram baseline is scored on the same tokens.", "")
        d.table(["scorer", "corpus", "bits per byte", "perplexity", "tokens"],
                [[r["name"], r["corpus"], d.v(r["bits_per_byte"]), d.v(r["perplexity"]), d.v(r["tokens"])]
                 for r in ev["rows"]])
        if ev["samples"]:
            d.add("Greedy samples:", "")
            d.table(["prompt", "completion"], [[d.v(x["prompt"]), d.v(x["completion"])] for x in ev["samples"]])

    d.add("## Environment and determinism class", "")
    d.table(["", "value"], [[k, d.v(fid)] for k, fid in {**env, **det, **doc["environment"]["code"]}.items()]
            + [["determinism class digest", d.v(doc["environment"]["determinism_digest"])]])
    d.table(["package", "version"], [[k, d.v(fid)] for k, fid in doc["environment"]["packages"].items()])

    d.add("## Verification status", "", "For each run in the model's lineage, the latest full replay by "
          "`marin verify` (else the latest segment replay: K of N checkpoint intervals, which catches one "
          "forged interval with probability K/N), and how many verifications the ledger holds.", "")
    d.table(["stage", "run", "result", "mode", "when", "verifier CPU", "verifier cores", "verifications"],
            [[v["stage"], f"`{v['run_id']}`", d.v(v["result"]), _mode(d, v), d.v(v.get("when")),
              d.v(v.get("where")), d.v(v.get("cores")), str(v.get("verifications", 0))] if v["result"] else
             [v["stage"], f"`{v['run_id']}`", "not verified", "", "", "", "", "0"] for v in doc["verification"]])

    d.add("## Lineage", "", "Runs behind this model (W3C PROV-JSON: `lineage.prov.json`).", "")
    d.table(["stage", "run", "status", "recipe digest", "git commit"],
            [[r["stage"], f"`{r['run_id']}`", r["status"], f"`{r['recipe_digest']}`", f"`{r['git_commit']}`"]
             for r in doc["lineage"]])

    d.add('## Sources <a id="sources"></a>', "", "Each fact: the ledger record (run, seq, record digest) and the "
          "JSON pointer to the value, in the record or in a recorded output file (with that file's digest); "
          "derived values name their formula.", "")
    rows = []
    for f in facts.values():
        src = f.source
        if "formula" in src:
            where = f"{src['formula']} of " + ", ".join(f"[{i}](#{i})" for i in src["inputs"])
            rows.append([f'<a id="{f.id}"></a>{f.id}', md_escape(f.label), "derived", "", "", where])
        else:
            ptr = f"`{src['file']}` ({src['file_digest']}) `{src['pointer']}`" if "file" in src \
                else f"`{src['pointer']}`"
            rows.append([f'<a id="{f.id}"></a>{f.id}', md_escape(f.label), f"`{src['run_id']}`", str(src["seq"]),
                         f"`{src['record']}`", ptr])
    d.table(["fact", "what", "run", "seq", "record digest", "value at"], rows)
    c = tr["curve"]
    d.add("Figures:", "")
    d.table(["figure", "run", "metric records (seq)", "digest of their record digests"],
            [[f'<a id="figure-{key}"></a>{key}', f"`{c['run_id']}`",
              f"{c['records'][0]['seq']}–{c['records'][-1]['seq']}" if c["records"] else "none",
              f"`{figure_source(c)}`"] for key, _ in CURVES])
    return d.text()


def _mode(d: Doc, v: dict[str, Any]) -> str:
    seg = v.get("segments")
    if not seg:
        return d.v(v.get("mode"))
    return f"{d.v(v['mode'])} {d.v(seg['k'])} of {d.v(seg['n'])} (seed {d.v(seg.get('seed_source'))})"


def _license(data: dict[str, Any], corpus: str) -> str | None:
    return next((c["license"] for c in data["funnel"] if c["corpus"] == corpus), None)


STYLE = """body{font-family:system-ui,-apple-system,'DejaVu Sans',sans-serif;max-width:980px;margin:2em auto;
padding:0 1em;color:#1b1b1b;line-height:1.45}table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.86em}
td,th{border:1px solid #ccd;padding:.25em .5em;text-align:left;vertical-align:top}th{background:#eef2f8}
code{font-size:.9em;word-break:break-all}a{color:#1f5fa8;text-decoration:none}a:hover{text-decoration:underline}
figure{margin:0}svg{max-width:100%;height:auto}h1{font-size:1.6em}h2{border-bottom:1px solid #ccd}"""


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
        tip = (f"{src['formula']}" if "formula" in src else f"{src['run_id']} seq {src['seq']} {src['record']}")
        body = body.replace(f'<a href="#{f.id}">', f'<a href="#{f.id}" title="{html.escape(tip)}">')
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f"<style>{STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n")

