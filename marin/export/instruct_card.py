"""The instruct model's card, ``models/hf-instruct/README.md`` in the Hugging Face Hub convention:
YAML metadata (``base_model`` names the base model) and what the fine-tune was: the base model by
digest, the instruction data (every source with its licence and digest, the built-in tasks and
counts), the SFT recipe, the chat format and how to use it. Every value comes from the instruct
model's config.json and the instruction manifest, both inputs of the export run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from marin import readers
from marin.config import Params
from marin.data import chat
from marin.errors import StageError
from marin.export.card import hf_license

MANIFEST = Path("data/instructions/manifest.json")


def recorded(params: Params) -> dict[str, Any]:
    """The params the card reads (the base model's name, the weights' licence, the language), as the
    export run records them: ``report``'s, or defaults."""
    base = params.report.model_name if params.report else "marin-tiny"
    return {"report": {"model_name": base, "license": params.report.license if params.report else "Apache-2.0",
                       "language": list(params.report.language) if params.report else []}}


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


def card(root: Path, recorded: dict[str, Any], config: dict[str, Any], tokenizer_json: bytes) -> str:
    """README.md of models/hf-instruct, from the params the export run records (:func:`recorded`)."""
    base, lic = recorded["report"]["model_name"], recorded["report"]["license"]
    name = f"{base}-instruct"
    m = readers.read_json(root / MANIFEST, "manifest", StageError)
    hf_lic = hf_license(lic)
    data = ModelCardData(license=hf_lic, license_name=lic if hf_lic == "other" else None, base_model=base,
                         language=recorded["report"].get("language") or None,
                         library_name="transformers", pipeline_tag="text-generation", model_name=name,
                         tags=["marin", "llama", "chat", "instruction-tuned", "sft", "reproducible"])
    recipe = config.get("sft", {})
    lines = [f"# {name}", "",
             f"`{base}` fine-tuned on instructions (supervised fine-tuning, the `sft` stage of marin). Base model: "
             f"`{base}` (`models/hf`), tensor digest `{config['base_model']['tensor_digest']}`, train recipe "
             f"`{config['base_model']['recipe_digest']}`. This model: tensor digest `{config['tensor_digest']}`, "
             f"sft recipe `{config['recipe_digest']}`.", "",
             "## How to use", "", "```python",
             "from transformers import AutoModelForCausalLM, AutoTokenizer",
             'tok = AutoTokenizer.from_pretrained("models/hf-instruct")',
             'model = AutoModelForCausalLM.from_pretrained("models/hf-instruct")',
             'messages = [{"role": "user", "content": "Which corpus is this line from? In the beginning God created '
             'the heaven and the earth."}]',
             "# sanitize_control_tokens: <|assistant|> or <|end|> in a message is text, never a forged turn",
             "ids = tok.apply_chat_template(messages, add_generation_prompt=True, sanitize_control_tokens=True, "
             "return_tensors=\"pt\", return_dict=True)",
             "out = model.generate(**ids, max_new_tokens=24, do_sample=False)",
             "print(tok.decode(out[0, ids[\"input_ids\"].shape[1]:], skip_special_tokens=True))", "```", "",
             "## Chat format", "",
             f"Special tokens {', '.join(f'`{t}`' for t in chat.CHAT_TOKENS)}; the Jinja template (in "
             f"`tokenizer_config.json`, digest `{config['chat_template']['digest']}`) renders "
             "`<|endoftext|><|user|>question<|end|><|assistant|>answer<|end|>`; generation stops at `<|end|>`.", "",
             "## Instruction data", "", *_data(m), "",
             "## SFT recipe", "", f"- Loss: {config['packing']}.",
             *[f"- `{k}`: {v}" for k, v in recipe.items()], ""]
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines)))
