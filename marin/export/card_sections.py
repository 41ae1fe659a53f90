"""The prose sections of an export's card that the Hub's model-card template asks for (intended uses,
limitations, risks, training details, environmental impact), from values the export run reads: the
model's config.json, the training run behind it (:mod:`marin.export.training`) and ``params.yaml:
report.energy``. The report's own card (``marin.report.usage.uses``) says the same with cited facts."""

from __future__ import annotations

from typing import Any

from marin.export.energy import co2_text, energy, kwh_text
from marin.export.training import Training


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def uses(name: str, context: int, instruct: bool) -> list[str]:
    """Intended uses, out-of-scope uses, limitations and risks."""
    what = ("answers short instructions in the chat format it was tuned on" if instruct
            else "continues text in the style of its training data")
    return ["## Uses", "", "### Intended uses", "",
            f"Research and teaching on reproducible language-model training: {name} {what}, and every number "
            "about it can be re-derived from the project's ledger and its runs replayed bit for bit (`marin "
            "verify`). A baseline to compare data, training or provenance changes against.", "",
            "### Out-of-scope uses", "",
            "Any use that relies on the generated text being correct, safe or fluent: advice, content for "
            "publication, decisions about people.", "",
            "## Bias, risks and limitations", "",
            f"- Context: at most {context} tokens, prompt and generation together. Without `max_new_tokens`, "
            "`generate` and `pipeline` give 20 new tokens and stop at the context (`max_position_embeddings` in "
            "config.json); a `max_new_tokens` that reaches past it runs the model on positions it never trained on.",
            "- Scale: a small model; it does not follow instructions or answer questions reliably"
            + (" beyond the tasks it was tuned on." if instruct else "."),
            "- Language and domain: those of the training sources; other languages, registers and domains are "
            "out of distribution.",
            "- Evaluation: only on held-out data of the same sources; no evaluation of knowledge, reasoning, "
            "bias, toxicity or memorisation on other data was run.",
            "- The training texts carry the views of their authors and their time; generated text can repeat "
            "them. Nothing was filtered for harmful content.",
            "- Fluent-looking text can be wrong or meaningless: do not present the model's output as fact.", ""]


def training(t: Training) -> list[str]:
    """Training details: the run, its hyperparameters, tokens seen, wall time and machine."""
    return ["## Training details", "",
            f"Training run `{t.run_id}` (stage `{t.stage}` of the marin pipeline; its ledger file "
            f"`ledger/runs/{t.run_id}.jsonl` records every input, parameter and checkpoint). Hyperparameters as "
            "the run recorded them:", "",
            *_table(["hyperparameter", "value"], [[f"`{k}`", f"{v}"] for k, v in sorted(t.hyper.items())]), "",
            f"Token positions trained on: {t.tokens:,} (steps × batch size × sequence length {t.seq_len}). "
            f"Wall time {t.wall_s:.1f} s on {t.devices} {t.backend} device(s), {t.cores} core(s); CPU: "
            f"{t.cpu_model}.", ""]


def environment(t: Training, assumptions: dict[str, Any] | None) -> list[str]:
    """Environmental impact of the training run, estimated from its CPU-hours (ML CO2 Impact's method)."""
    out = ["## Environmental impact", "",
           f"- Hardware type: {t.cpu_model} ({t.backend}), {t.cores} core(s)",
           f"- Hours used: {t.wall_s / 3600:.4f} wall-clock hours, {t.cpu_hours:.4f} CPU-hours (this training run "
           "only: process start, data preparation and evaluation are not counted)"]
    if not assumptions:
        return [*out, "- Energy and carbon emitted: not estimated (no `report.energy` assumptions in params.yaml)", ""]
    kwh, kg = energy(t.cpu_hours, 0.0, assumptions)
    return [*out, f"- Energy (an estimate, not a reading): {kwh_text(kwh)}, at "
            f"{assumptions['cpu_watts_per_core']} W per core and a PUE of {assumptions['pue']}",
            f"- Carbon emitted (an estimate): {co2_text(kg)}, at {assumptions['kg_co2e_per_kwh']} kg CO2e per kWh", ""]


def revisions(t: Training, repo: str) -> list[str]:
    """The training run's checkpoints as the Hub revisions ``marin publish --revisions`` writes (a branch
    ``step<N>`` each, where Pythia's and OLMo's users look for them); nothing without checkpoints."""
    if not t.checkpoints:
        return []
    return ["## Intermediate checkpoints", "",
            f"Training run `{t.run_id}` saved {len(t.checkpoints)} checkpoints, one Hub revision (branch) each: "
            + ", ".join(f"`step{s}`" for s in t.checkpoints) + ". `marin publish --hf-folder OUT --revisions` writes "
            "them, each checked against the tensor digest the ledger recorded for it, and prints the `hf upload "
            "... --revision step<N>` that pushes each; once pushed, a revision loads by its name:", "",
            "```python", f'model = AutoModelForCausalLM.from_pretrained("{repo}", revision="step{t.checkpoints[0]}")',
            "```", ""]
