"""The report's "How to use" (the Hugging Face export: its path and digests, cited from the export
run's ``hf_model`` output record), "Intended use", "Limitations" and "Risks" sections; the model card
prints the same sections (:mod:`marin.report.cards`)."""

from __future__ import annotations

from typing import Any

from marin.report import budget
from marin.report.facts import Context, Facts, output
from marin.report.page import Page, V


def facts(f: Facts, c: Context) -> dict[str, Any] | None:
    """Fact ids of the export's digests; None when no export run read the model."""
    log = c.logs.get("export")
    if log is None:
        return None
    out = output(log, "hf_model")
    return {"run_id": log.run_id, "path": out.body_as("output")["path"],
            "digest": f.cite("Hugging Face export folder digest", log, out, "/body/digest").id,
            "tensor_digest": f.cite("Hugging Face export: tensor digest of the model it holds", log, out,
                                    "/body/tensor_digest").id}


def lines(p: Page) -> list[str]:
    return [*how_to_use(p.v, p.doc), *uses(p.v, p.doc)]


def how_to_use(v: V, doc: dict[str, Any], level: str = "##") -> list[str]:
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


def uses(v: V, doc: dict[str, Any], level: str = "##") -> list[str]:
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
    harness: dict[str, Any] = doc.get("harness") or {}
    if harness.get("rows"):  # no count here: every number of a card is a cited fact
        done.append("lm-evaluation-harness tasks whose data is cut from that split")
    if doc.get("instruct"):
        done.append("the instruct model's answers to held-out instructions from it")
    return (f"- Evaluation: only on held-out data of the same sources ({'; '.join(done)}); no evaluation of "
            "knowledge, reasoning, bias, toxicity or memorisation on other data was run.")
