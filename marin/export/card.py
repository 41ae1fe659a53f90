"""The model card of a Hugging Face export (``<folder>/README.md``), in the Hub's convention: YAML
metadata (licence, language, datasets, tags, ``model-index`` results, ``base_model`` where the
model was trained from another) that ``huggingface_hub.ModelCard`` parses, then the text.

The export travels without the report, so the card states values, not links: each comes from
what the export run records as its inputs and params (the model's config.json, metrics/eval.json,
params.yaml's report, fetch and evaluate sections), so that a replay of the run writes the same
card. The report's own card (``marin.report.cards``) builds its metadata with the same two
functions, ``model_index`` and ``metadata``, from the ledger's facts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from marin.export import benchmarks, card_sections
from marin.export.training import Training

TAGS = ("marin", "llama", "jax", "flax", "causal-lm", "reproducible")
METRICS = {"bits_per_byte": "bits per byte", "perplexity": "perplexity"}
# The Hugging Face Hub's licence ids (its documented list, mostly SPDX ids in lower case); others go in as
# "other" with a license_name.
HF_LICENSES = frozenset({
    "apache-2.0", "mit", "openrail", "afl-3.0", "artistic-2.0", "bsl-1.0", "bsd", "bsd-2-clause", "bsd-3-clause",
    "bsd-3-clause-clear", "c-uda", "cc", "cc0-1.0", "cc-by-2.0", "cc-by-2.5", "cc-by-3.0", "cc-by-4.0",
    "cc-by-sa-3.0", "cc-by-sa-4.0", "cc-by-nc-2.0", "cc-by-nc-3.0", "cc-by-nc-4.0", "cc-by-nd-4.0",
    "cc-by-nc-nd-3.0", "cc-by-nc-nd-4.0", "cc-by-nc-sa-2.0", "cc-by-nc-sa-3.0", "cc-by-nc-sa-4.0",
    "cdla-sharing-1.0", "cdla-permissive-1.0", "cdla-permissive-2.0", "wtfpl", "ecl-2.0", "epl-1.0", "epl-2.0",
    "etalab-2.0", "eupl-1.1", "eupl-1.2", "agpl-3.0", "gfdl", "gpl", "gpl-2.0", "gpl-3.0", "lgpl", "lgpl-2.1",
    "lgpl-3.0", "isc", "lppl-1.3c", "ms-pl", "mpl-2.0", "odc-by", "odbl", "osl-3.0", "postgresql", "ofl-1.1",
    "ncsa", "unlicense", "zlib", "pddl", "unknown", "other"})


def hf_license(spdx: str) -> str:
    """The Hub's id of an SPDX licence, or "other"."""
    lic = str(spdx).lower()
    return lic if lic in HF_LICENSES else "other"


@dataclass(frozen=True)
class Measure:
    """One evaluation number of the model: ``metric`` (a key of METRICS) on a split of a corpus."""

    split: str
    corpus: str
    metric: str
    value: float


def model_index(datasets: list[str], measures: Iterable[Measure], extra: Iterable[EvalResult] = ()) -> list[EvalResult]:
    """The card's ``model-index`` results: each measure on the held-out split of the sources, then
    ``extra`` (results of other evaluations, e.g. a benchmark harness) as they are."""
    src = "+".join(datasets)
    return [*(EvalResult(task_type="text-generation", task_name="Causal language modeling", dataset_type=src,
                         dataset_name=f"{src} {m.split} split ({m.corpus})", dataset_config=m.corpus,
                         dataset_split=m.split, metric_type=m.metric, metric_value=m.value,
                         metric_name=f"{m.split} {METRICS[m.metric]}") for m in measures), *extra]


def harness_result(task: str, metric: str, value: float, shots: int, source_url: str | None = None,
                   note: str = "", dataset: str | None = None, split: str | None = None) -> EvalResult:
    """One lm-evaluation-harness result as a ``model-index`` entry: a registry task's under its Hub ``dataset``
    id and the ``split`` it scored (the Hub links results by both), a built-in task's under its own name on
    the validation split its data was cut from; ``note`` (:func:`marin.evaluate.baselines.note`) follows the
    shots in its metric name."""
    ds, sp = (dataset, split or "validation") if dataset else (task, "validation")
    return EvalResult(task_type="text-generation", task_name=task, dataset_type=ds,
                      dataset_name=f"{ds} ({sp} split)", dataset_split=sp, metric_type=metric,
                      metric_value=value, metric_name=f"{metric} ({shots}-shot{note})",
                      source_name="marin ledger" if source_url else None, source_url=source_url)


def harness_results(eval_json: dict[str, Any]) -> list[EvalResult]:
    """metrics/eval.json's harness results (task -> metric values, stderrs, baselines, counts), each
    named with its stderr, samples of items (and limit) and its mark against the best baseline."""
    from marin.evaluate import baselines as bl

    return [harness_result(r["task"], r["metric"], r["value"], r["num_fewshot"] or 0,
                           note=bl.note(r["stderr"], r["samples"], r["items"], r["limit"], r["mark"]),
                           dataset=r["dataset"], split=r["dataset_split"]) for r in benchmarks.rows(eval_json)]


def metadata(meta: dict[str, Any], datasets: list[str], results: list[EvalResult], *, library: bool,
             base_model: str | None = None) -> ModelCardData:
    """A card's metadata from the report's ``meta`` (params.yaml: report), the source names and results."""
    lic = hf_license(meta["license"])
    return ModelCardData(license=lic, license_name=str(meta["license"]) if lic == "other" else None,
                         language=list(meta.get("language") or []) or None, datasets=datasets or None,
                         library_name="transformers" if library else None, pipeline_tag="text-generation",
                         model_name=meta["model_name"], base_model=base_model, tags=list(TAGS),
                         eval_results=results or None)


def measures(eval_json: dict[str, Any], split: str = "validation") -> list[Measure]:
    """metrics/eval.json as measures: all corpora (bits per byte, perplexity), then each corpus's bits per byte."""
    out = [Measure(split, "all", k, eval_json[k]) for k in METRICS if k in eval_json]
    return out + [Measure(split, c, "bits_per_byte", v) for c, v in sorted(eval_json.get("per_corpus", {}).items())
                  if len(eval_json["per_corpus"]) > 1]


@dataclass(frozen=True)
class Sample:
    """The generation the card's snippet shows: the evaluate stage's first prompt, as many greedy
    tokens as fit the context after it (where the JAX sampler starts to slide its window)."""

    prompt: str
    max_new_tokens: int


def snippet(folder: str, sample: Sample) -> list[str]:
    """Python that loads ``folder`` and prints the evaluate stage's greedy completion of the prompt."""
    return ["```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
            f'model = AutoModelForCausalLM.from_pretrained("{folder}")',
            f'tokenizer = AutoTokenizer.from_pretrained("{folder}")',
            "# the tokenizer starts every text with the end-of-text token (its BOS), as every training document",
            "# followed one; text never becomes a special token",
            f"inputs = tokenizer({json.dumps(sample.prompt)}, return_tensors=\"pt\")",
            f"out = model.generate(**inputs, max_new_tokens={sample.max_new_tokens}, do_sample=False)",
            'print(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:]))', "```"]


def pipeline_snippet(folder: str, sample: Sample) -> list[str]:
    """The same generation through ``transformers.pipeline("text-generation")``."""
    return ["```python", "from transformers import pipeline", "",
            f'generate = pipeline("text-generation", model="{folder}")',
            f"out = generate({json.dumps(sample.prompt)}, max_new_tokens={sample.max_new_tokens}, do_sample=False, "
            "return_full_text=False)",
            'print(out[0]["generated_text"])', "```"]


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def _citation(meta: dict[str, Any], tensor_digest: str) -> list[str]:
    key = "".join(ch for ch in meta["model_name"] if ch.isalnum())
    fields = [("title", f"{meta['model_name']} {meta.get('version', '')}".strip()),
              ("author", " and ".join("{" + a + "}" for a in meta.get("authors") or []) or "{not recorded}"),
              ("note", f"Model tensor digest {tensor_digest}"), *([("url", meta["url"])] if meta.get("url") else [])]
    return ["```bibtex", "@misc{" + key + ",\n" + ",\n".join(f"  {k} = {{{v}}}" for k, v in fields) + "\n}", "```"]


def hub_datasets(sources: list[dict[str, Any]]) -> list[str]:
    """The Hub dataset ids the sources name (``fetch.sources[].hub_dataset``); a source without one is left out
    of the card's ``datasets`` rather than given a made-up id."""
    return [str(s["hub_dataset"]) for s in sources if s.get("hub_dataset")]


def repo_id(meta: dict[str, Any]) -> str | None:
    """The base model's Hub id (``params.yaml: report.hub.repo_id``), if given."""
    return (meta.get("hub") or {}).get("repo_id") or None


def upload_lines(meta: dict[str, Any], folder: str) -> list[str]:
    """How to publish the folder on the Hub: to ``report.hub.repo_id`` when given."""
    target = repo_id(meta) or f"<your-name>/{meta['model_name']}"
    return ["To publish this folder on the Hugging Face Hub (it holds exactly the files "
            "`huggingface_hub.upload_folder` sends):", "", "```bash", f"hf upload {target} {folder} .", "```", ""]


def hub_card(meta: dict[str, Any], sources: list[dict[str, Any]], model: dict[str, Any], eval_json: dict[str, Any],
             sample: Sample, folder: str, *, training: Training | None = None, base_model: str | None = None,
             extra_results: Iterable[EvalResult] = ()) -> str:
    """README.md of an export folder: ``meta`` (params.yaml: report), ``sources`` (fetch.sources),
    ``model`` (models/final/config.json), ``eval_json`` (metrics/eval.json), ``training`` (the run behind it)."""
    name, arch = meta["model_name"], model["model"]
    results = model_index([s["name"] for s in sources], measures(eval_json),
                          [*harness_results(eval_json), *extra_results])
    head = metadata(meta, hub_datasets(sources), results, library=True, base_model=base_model)
    out = [f"# {name}", "",
           f"{name} is a decoder-only transformer language model (Llama architecture, {model['n_params']:,} "
           f"parameters, context {arch['max_seq_len']} tokens) trained from scratch by the marin pipeline"
           + (f", starting from `{base_model}`" if base_model else "") + f", {model['step']:,} optimizer steps. "
           f"Its tensor digest (sha256 over its tensors, the model's identity in any format) is "
           f"`{model['tensor_digest']}`. The project's transparency report (`reports/{name}/report.md`) cites "
           "the ledger record behind every value here.", "", "## How to use", ""]
    out += snippet(folder, sample)
    out += ["", "This prints the greedy completion the evaluate stage recorded for the prompt. "
            "`pipeline(\"text-generation\")` gives the same (its text leaves special tokens out):", "",
            *pipeline_snippet(folder, sample), "",
            "The tokenizer pads on the left, so a batch (`tokenizer([a, b], padding=True, return_tensors=\"pt\")`) "
            "generates each prompt as it would alone.", "", *upload_lines(meta, folder)]
    out += card_sections.uses(name, arch["max_seq_len"], instruct=False)
    out += ["## Training data", ""]
    out += _table(["source", "licence (the archive's)", "texts' own licence", "locator", "Hub dataset"],
                  ([f"`{s['name']}`", str(s.get("license", "not recorded")), str(s.get("text_license") or "the same"),
                    f"{s.get('kind', '')} `{s.get('locator', '')}`", s.get("hub_dataset") or "none given"]
                   for s in sources))
    notes = [f"- `{s['name']}`: {s['license_note']}" for s in sources if s.get("license_note")]
    out += ["", "Licence notes and attribution:", "", *notes] if notes else []  # what CC BY asks of a redistributor
    out += ["", f"Language: {', '.join(meta.get('language') or []) or 'not recorded'}.", ""]
    if training is not None:
        out += card_sections.training(training)
        out += card_sections.revisions(training, repo_id(meta) or f"<your-name>/{name}")
    out += ["## Evaluation", "", "On the held-out validation split of the same sources (`model-index` in this "
            "card's metadata holds these and the benchmark results):", ""]
    out += _table(["split", "corpus", "metric", "value"],
                  ([m.split, m.corpus, METRICS[m.metric], f"{m.value:.4f}"] for m in measures(eval_json)))
    out += ["", *benchmarks.table(benchmarks.rows(eval_json), benchmarks.plain, "the evaluate stage's "
                                  "metrics/eval.json; the technical report cites the ledger record of each")]
    if training is not None:
        out += card_sections.environment(training, meta.get("energy"))
    out += ["## Licence and citation", "", f"Weights: {meta['license']}; code: {meta.get('code_license', '')}.", ""]
    out += _citation(meta, model["tensor_digest"])
    card = ModelCard("---\n" + head.to_yaml() + "\n---\n\n" + "\n".join(out) + "\n")  # the Hub's parser reads it
    return str(card.content)
