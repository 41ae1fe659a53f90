"""The trained model as a Hugging Face Llama checkpoint: ``models/hf/``.

``AutoModelForCausalLM.from_pretrained("models/hf")`` and ``AutoTokenizer.from_pretrained(
"models/hf")`` load it; nothing here imports torch or transformers (the files are written
from their documented formats), and the tests load the result with both.

marin's decoder is the Llama architecture (marin/model/transformer.py), so each parameter
maps to one Llama tensor with no change of values:

- Linear layers: flax ``kernel`` is (in, out), torch ``weight`` is (out, in): transposed.
- RoPE: marin rotates channel pairs (i, i + Dh/2) ("rotate half", GPT-NeoX / Llama layout)
  with ``inv_freq = theta ** (-2i / Dh)``: exactly ``LlamaRotaryEmbedding`` and
  ``rotate_half``, so q and k need no permutation (a Meta-layout checkpoint would).
- GQA: query head h reads kv head h // G, as ``repeat_kv`` does.
- RMSNorm: ``x * rsqrt(mean(x^2) + 1e-6) * scale``, weight = scale, eps 1e-6.
- SwiGLU: ``down(silu(gate(x)) * up(x))``, ``hidden_act = "silu"``; no biases anywhere.
- Tied embeddings: ``lm_head`` is the embedding matrix (``tie_word_embeddings``).

One function per block maps its tensors, so a change of marin's parameter layout (say, a
fused q/k/v matrix) changes one function.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
from safetensors.numpy import save
from tokenizers import Tokenizer

from marin.data import chat
from marin.errors import StageError

WEIGHTS, CONFIG = "model.safetensors", "config.json"
TOKENIZER = "tokenizer.json"
RMS_EPS = 1e-6  # marin.model.transformer.RMSNorm's default
README = "README.md"  # the model card, as the Hub shows it
# The transformers release whose formats these files follow (the hf group's pin in uv.lock; a test checks
# that the installed one matches). The Hub and from_pretrained read it from config.json.
TRANSFORMERS_VERSION = "5.24.0"

Tensors = dict[str, np.ndarray]


def _linear(kernel: np.ndarray) -> np.ndarray:
    """A flax kernel (in, out) as a torch Linear weight (out, in)."""
    return np.ascontiguousarray(kernel.T)


def attention_tensors(src: Tensors, i: int) -> Tensors:
    """Block ``i``'s attention: wq/wk/wv/wo kernels -> self_attn.{q,k,v,o}_proj.weight."""
    a, hf = f"blocks.{i}.attn", f"model.layers.{i}.self_attn"
    return {f"{hf}.{t}_proj.weight": _linear(src[f"{a}.w{m}.kernel"])
            for t, m in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "o"))}


def mlp_tensors(src: Tensors, i: int) -> Tensors:
    """Block ``i``'s SwiGLU: w_gate/w_up/w_down kernels -> mlp.{gate,up,down}_proj.weight."""
    m, hf = f"blocks.{i}.mlp", f"model.layers.{i}.mlp"
    return {f"{hf}.{t}_proj.weight": _linear(src[f"{m}.w_{t}.kernel"]) for t in ("gate", "up", "down")}


def norm_tensors(src: Tensors, i: int) -> Tensors:
    """Block ``i``'s two RMSNorm scales -> input_layernorm / post_attention_layernorm."""
    b, hf = f"blocks.{i}", f"model.layers.{i}"
    return {f"{hf}.input_layernorm.weight": src[f"{b}.attn_norm.scale"],
            f"{hf}.post_attention_layernorm.weight": src[f"{b}.mlp_norm.scale"]}


def outer_tensors(src: Tensors, tied: bool) -> Tensors:
    """Embedding, final norm and (untied only) the output head."""
    out = {"model.embed_tokens.weight": src["embed.embedding"], "model.norm.weight": src["final_norm.scale"]}
    if not tied:
        out["lm_head.weight"] = _linear(src["lm_head.kernel"])
    return out


BLOCK_MAPS: tuple[Callable[[Tensors, int], Tensors], ...] = (attention_tensors, mlp_tensors, norm_tensors)


class _Reads(dict):
    """The source tensors, remembering which were read (what is left over has no Llama name)."""

    def __init__(self, src: Tensors):
        super().__init__(src)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self:
            raise StageError(f"models/final: no tensor {key!r}; update marin/export/hf.py for the new layout")
        self.read.add(key)
        return super().__getitem__(key)


def llama_tensors(src: Tensors, model: dict[str, Any]) -> Tensors:
    """Every marin tensor under its Llama name; a tensor left unmapped (or missing) is an error."""
    reads = _Reads(src)
    out = outer_tensors(reads, model["tie_embeddings"])
    for i in range(model["n_layers"]):
        for fn in BLOCK_MAPS:
            out.update(fn(reads, i))
    if set(src) - reads.read:
        raise StageError(f"models/final: tensors {sorted(set(src) - reads.read)} have no Llama name; "
                         "update marin/export/hf.py for the new layout")
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def llama_config(model: dict[str, Any], eos_id: int) -> dict[str, Any]:
    """config.json of a ``LlamaForCausalLM`` with marin's sizes."""
    theta = float(model["rope_theta"])
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": model["vocab_size"], "hidden_size": model["d_model"],
            "intermediate_size": model["d_ff"], "num_hidden_layers": model["n_layers"],
            "num_attention_heads": model["n_heads"], "num_key_value_heads": model["n_kv_heads"],
            "head_dim": model["d_model"] // model["n_heads"], "hidden_act": "silu",
            "max_position_embeddings": model["max_seq_len"], "rms_norm_eps": RMS_EPS,
            "rope_parameters": {"rope_type": "default", "rope_theta": theta}, "rope_theta": theta,
            "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0,
            "tie_word_embeddings": bool(model["tie_embeddings"]), "torch_dtype": "float32", "dtype": "float32",
            "bos_token_id": eos_id, "eos_token_id": eos_id, "pad_token_id": eos_id, "use_cache": True,
            "initializer_range": 0.02, "transformers_version": TRANSFORMERS_VERSION}


def tokenizer_config(eos: str, max_len: int, chat_template: str | None = None) -> dict[str, Any]:
    """tokenizer_config.json: the project's byte-level BPE as a fast tokenizer. The end-of-text token is
    also the BOS: every training document followed one, so ``tokenizer(text)`` starts with it
    (:func:`with_bos`) and ``pipeline("text-generation")`` continues a prompt as the evaluate stage does.
    Padding is on the left, as batched generation of a decoder needs; ``model_max_length`` is the context.
    ``chat_template``: the Jinja template ``apply_chat_template`` renders (a chat model's; it writes the
    end-of-text token itself, so no BOS is added there).

    Text never becomes a special token, as in marin: without a template ``split_special_tokens``
    makes ``tokenizer(text)`` encode ``<|endoftext|>`` or ``<|assistant|>`` in text as ordinary
    tokens. A chat model cannot set it (transformers would split the template's own role tokens
    too); ``apply_chat_template(..., sanitize_control_tokens=True)`` encodes the messages' content
    as text instead, the ids marin's sft trains on (the card and tests/test_special_tokens.py)."""
    # no add_bos_token key: transformers would rebuild the post-processor from it, before it knows the BOS
    out = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "bos_token": eos, "pad_token": eos,
           "unk_token": None, "model_max_length": max_len, "padding_side": "left", "truncation_side": "left",
           "clean_up_tokenization_spaces": False}
    if chat_template is None:
        return {**out, "split_special_tokens": True}
    return {**out, "chat_template": chat_template}


def with_bos(tokenizer_json: bytes, eos: str) -> bytes:
    """The tokenizer with a post-processor that starts every text with ``eos`` (``tokenizer(text)`` and
    ``add_special_tokens=True``, the default of ``pipeline("text-generation")``); lm-eval's ``hf`` model and
    ``add_special_tokens=False`` get the bare ids."""
    from tokenizers.processors import TemplateProcessing

    tok = Tokenizer.from_str(tokenizer_json.decode())
    tok.post_processor = TemplateProcessing(single=f"{eos} $A", pair=f"{eos} $A {eos} $B",  # pyright: ignore[reportAttributeAccessIssue]
                                            special_tokens=[(eos, tok.token_to_id(eos))])
    return tok.to_str().encode()


def generation_config(eos_id: int, stop: int | list[int]) -> dict[str, Any]:
    """generation_config.json: greedy decoding, as the evaluate stage samples, stopping at ``stop``. No
    ``max_length``: transformers warns on every ``generate(..., max_new_tokens=...)`` when the file sets both,
    and without one it generates 20 new tokens by default, never past ``max_position_embeddings`` (the
    context, in config.json)."""
    return {"bos_token_id": eos_id, "eos_token_id": stop, "pad_token_id": eos_id, "do_sample": False,
            "transformers_version": TRANSFORMERS_VERSION}


def stable_header(blob: bytes) -> bytes:
    """A safetensors file with its ``__metadata__`` keys sorted: safetensors keeps them in a hash map, so
    their order (and the file's bytes) changed from one process to the next; the tensors are untouched."""
    n = int.from_bytes(blob[:8], "little")
    head = json.loads(blob[8:8 + n])
    if "__metadata__" in head:
        head["__metadata__"] = dict(sorted(head["__metadata__"].items()))
    text = json.dumps(head, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the header is padded to 8 bytes, as safetensors writes it
    return len(text).to_bytes(8, "little") + text + blob[8 + n:]


def _json(obj: object) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def files(src: Tensors, marin_config: dict[str, Any], tokenizer_json: bytes, eos: str,
          meta: dict[str, str], card: str, chat_template: str | None = None) -> dict[str, bytes]:
    """Every file of the export, as bytes (deterministic for the same model, tokenizer and card): exactly
    the files ``huggingface_hub.upload_folder`` sends, the card as README.md. With a ``chat_template``,
    generation also stops at the chat's ``<|end|>`` token."""
    model = marin_config["model"]
    eos_id = marin_config["tokenizer"]["eos_id"]
    tensors = llama_tensors(src, model)
    stop: int | list[int] = eos_id
    if chat_template is not None:
        stop = [eos_id, chat.special_id(Tokenizer.from_str(tokenizer_json.decode()), chat.END)]
    return {
        WEIGHTS: stable_header(save(tensors, metadata={"format": "pt", **meta})),
        CONFIG: _json(llama_config(model, eos_id)),
        "generation_config.json": _json(generation_config(eos_id, stop)),
        TOKENIZER: tokenizer_json if chat_template is not None else with_bos(tokenizer_json, eos),
        "tokenizer_config.json": _json(tokenizer_config(eos, model["max_seq_len"], chat_template)),
        "special_tokens_map.json": _json({"bos_token": eos, "eos_token": eos, "pad_token": eos}),
        README: card.encode(),
    }
