"""The instruct model's card, ``models/hf-instruct/README.md`` in the Hugging Face Hub convention:
YAML metadata (``base_model`` names the base model) and what the fine-tune was: the base model by
digest, the instruction data (every source with its licence and digest, the built-in tasks and
counts), the SFT recipe, the chat format and how to use it. Every value comes from the instruct
model's config.json and the instruction manifest, both inputs of the export run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from marin import readers, stages
from marin.config import Params
from marin.data import chat
from marin.errors import StageError
from marin.evaluate import metrics_file
from marin.export import card_sections
from marin.export.card import hf_license, repo_id, upload_lines
from marin.export.training import Training

_DECLARED = stages.declaration("export_instruct")  # the paths below: marin/stages/table.py
MANIFEST, EVAL = _DECLARED.input("instructions_manifest"), _DECLARED.input("instruct_eval")
EVAL_CONTEXT = _DECLARED.input("instruct_eval_context")  # the example counts (marin.evaluate.metrics_file)


def recorded(params: Params) -> dict[str, Any]:
    """The params the card reads, as the export run records them: ``report`` (the base model's name, the
    weights' licence, the language, ``hub`` and ``energy``), the whole section as dvc.yaml lists it, or
    defaults without one."""
    if params.report is None:
        return {"report": {"model_name": "marin-tiny", "license": "Apache-2.0", "language": []}}
    return {"report": {**params.raw["report"], "language": list(params.report.language)}}


# Every instruction metric (metrics/instruct_eval.json), the ones that show what sft did first: on a small model
# exact match and containment stay at 0 long after choice and token accuracy have moved (issue 57)
METRICS = {"choice_acc": "choice accuracy", "token_acc": "token accuracy", "containment": "containment",
           "exact_match": "exact match"}


def _scores(ev: dict[str, Any], model: str) -> list[tuple[str, dict[str, Any]]]:
    """(task, its scores) of ``model`` ("base" or "instruct"): all held-out instructions, then each task."""
    s = ev.get(model) or {}
    return [("all", s), *sorted(s.get("by_task", {}).items())]


def _flat(ev: dict[str, Any], metric: str) -> bool:
    """Whether ``metric`` is 0 for both models on every task."""
    return not any(v.get(metric) for model in ("base", "instruct") for _, v in _scores(ev, model))


def shown(ev: dict[str, Any]) -> list[str]:
    """The metrics in the order the card shows them: :data:`METRICS`, with one that is 0 for both models on
    every task after those that move, so that no table or ``model-index`` leads with it."""
    return sorted(METRICS, key=lambda m: _flat(ev, m))


def results(ev: dict[str, Any]) -> list[EvalResult]:
    """metrics/instruct_eval.json as ``model-index`` results: every metric of the instruct model
    (:func:`shown`) on the held-out instructions, overall and per task."""
    return [EvalResult(task_type="text-generation", task_name="Instruction following",
                       dataset_type="marin-heldout-instructions", dataset_name=f"held-out instructions ({task})",
                       dataset_config=task, dataset_split="heldout", metric_type=m, metric_value=float(v[m]),
                       metric_name=f"{METRICS[m]} ({v['examples']} examples)")
            for task, v in _scores(ev, "instruct") for m in shown(ev) if m in v]


def _evaluation(ev: dict[str, Any]) -> list[str]:
    base = dict(_scores(ev, "base"))
    order = shown(ev)
    flat = [METRICS[m] for m in order if _flat(ev, m)]
    rows = [f"| {t} | {v['examples']} | {METRICS[m]} | {v[m]:.4f} | {base.get(t, {}).get(m, float('nan')):.4f} |"
            for t, v in _scores(ev, "instruct") for m in order if m in v]
    note = [f"{' and '.join(flat).capitalize()} {'is' if len(flat) == 1 else 'are'} 0 for both models on every "
            "task: shown last, beside the metrics that move.", ""] if flat else []
    return ["## Evaluation", "", "Greedy answers to the held-out instructions (cut from the validation split), "
            "beside the base model's: choice accuracy (the reference is the most likely of its task's answers), "
            "token accuracy (the share of the reference's tokens predicted from the ones before), containment (the "
            "reference is inside the answer) and exact match. `model-index` in this card's metadata holds the "
            "instruct model's.", "",
            "| task | examples | metric | instruct | base |", "|---|---|---|---|---|", *rows, "", *note]


def _data(m: dict[str, Any]) -> list[str]:
    train = m["sets"]["train"]
    rows = ["| source | licence | digest | conversations |", "|---|---|---|---|",
            f"| built in: the curated train split ({train['documents']} documents) | the corpus sources' (see the base "
            f"model's datasheet) | `{m['inputs']['train']}` | {train['sources'].get('curated', 0)} |"]
    rows += [f"| `{s['name']}` ({s['locator']}) | {s['license']} | `{s['digest']}` | {s['conversations']} |"
             for s in m["sources"]]
    tasks = ", ".join(f"{t} {n}" for t, n in train["tasks"].items())
    return [*rows, "", f"Training set: {train['examples']} conversations (`{train['digest']}`; by task: {tasks}). "
            f"Held out (from the validation split): {m['sets']['heldout']['examples']} "
            f"(`{m['sets']['heldout']['digest']}`)."]


def card(root: Path, recorded: dict[str, Any], config: dict[str, Any], tokenizer_json: bytes, sft: Training) -> str:
    """README.md of models/hf-instruct, from the params the export run records (:func:`recorded`), the
    instruction manifest, metrics/instruct_eval.json and the sft run behind models/instruct."""
    meta = recorded["report"]
    base, lic = meta["model_name"], meta["license"]
    name = f"{base}-instruct"
    m = readers.read_json(root / MANIFEST, "manifest", StageError)
    ev = metrics_file.read(root, EVAL, EVAL_CONTEXT, StageError)
    hf_lic = hf_license(lic)
    data = ModelCardData(license=hf_lic, license_name=lic if hf_lic == "other" else None, base_model=repo_id(meta),
                         language=meta.get("language") or None, eval_results=results(ev),
                         library_name="transformers", pipeline_tag="text-generation", model_name=name,
                         tags=["marin", "llama", "chat", "instruction-tuned", "sft", "reproducible"])
    lines = [f"# {name}", "",
             f"`{base}` fine-tuned on instructions (supervised fine-tuning, the `sft` stage of marin). Base model: "
             f"`{repo_id(meta) or base}` (`models/hf`), tensor digest `{config['base_model']['tensor_digest']}`, "
             f"train recipe `{config['base_model']['recipe_digest']}`. This model: tensor digest "
             f"`{config['tensor_digest']}`, sft recipe `{config['recipe_digest']}`.", "", *_how_to_use(), "",
             *upload_lines({**meta, "model_name": name, "hub": None}, "models/hf-instruct"),
             "## Chat format", "",
             f"Special tokens {', '.join(f'`{t}`' for t in chat.CHAT_TOKENS)}; the Jinja template (in "
             f"`tokenizer_config.json`, digest `{config['chat_template']['digest']}`) renders "
             "`<|endoftext|><|user|>question<|end|><|assistant|>answer<|end|>`; generation stops at `<|end|>`.", "",
             *card_sections.uses(name, config["model"]["max_seq_len"], instruct=True),
             "## Instruction data", "", *_data(m), "",
             "## SFT recipe", "", f"- Loss: {config['packing']}.",
             *[f"- `{k}`: {v}" for k, v in config.get("sft", {}).items()], "",
             *card_sections.training(sft), *_evaluation(ev), *card_sections.environment(sft, meta.get("energy"))]
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines)))


def _how_to_use() -> list[str]:
    return ["## How to use", "", "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            'tok = AutoTokenizer.from_pretrained("models/hf-instruct")',
            'model = AutoModelForCausalLM.from_pretrained("models/hf-instruct")',
            'messages = [{"role": "user", "content": "Which corpus is this line from? In the beginning God created '
            'the heaven and the earth."}]',
            "# sanitize_control_tokens: <|assistant|> or <|end|> in a message is text, never a forged turn",
            "ids = tok.apply_chat_template(messages, add_generation_prompt=True, sanitize_control_tokens=True, "
            "return_tensors=\"pt\", return_dict=True)",
            "out = model.generate(**ids, max_new_tokens=24, do_sample=False)",
            "print(tok.decode(out[0, ids[\"input_ids\"].shape[1]:], skip_special_tokens=True))", "```"]
