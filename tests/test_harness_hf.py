"""The independent check of the JAX adapter: lm-eval's own ``hf`` model on the transformers export
(models/hf, the ``hf`` group) gives, on every built-in task, the same accuracy and per-sample
log-likelihoods within 1e-4 as :class:`marin.evaluate.harness.MarinLM` on the JAX model."""

from __future__ import annotations

import json

import pytest

from tests.conftest import Project, copy_project

pytestmark = pytest.mark.slow

TASKS = ("marin_cloze", "marin_cloze_fewshot", "marin_next_word")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, _trained_project: Project) -> Project:
    proj = copy_project(_trained_project, tmp_path_factory.mktemp("hfcheck") / "proj")
    proj.stage("export")
    return proj


def _evaluate(lm, root, tasks=TASKS) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from marin.evaluate import harness_run

    with harness_run.offline(root):
        tm = TaskManager(include_path=[str(harness_run.BUILTIN)], include_defaults=False)
        return simple_evaluate(model=lm, tasks=list(tasks), task_manager=tm, limit=200, random_seed=1234,
                               numpy_random_seed=1234, torch_random_seed=1234, fewshot_random_seed=1234,
                               bootstrap_iters=0, log_samples=True)


def test_lm_evals_hf_model_on_the_export_agrees_with_the_jax_adapter(exported: Project) -> None:
    from tests.test_export import _hf_libs

    _hf_libs()  # never a skip: without the hf group this check fails, saying so
    from lm_eval.models.huggingface import HFLM

    from marin.data import tokenize as tk
    from marin.evaluate.harness import MarinLM
    from marin.model import weights

    root = exported.root
    graphdef, params, config = weights.load(root / "models/final")
    eos = json.loads((root / "data/tokens/manifest.json").read_text())["tokenizer"]["eos_id"]
    seq_len = config["model"]["max_seq_len"]
    ours = _evaluate(MarinLM(graphdef, params, tk.load(root / "data/tokens/tokenizer.json"), eos, seq_len), root)
    hf = HFLM(pretrained=str(root / "models/hf"), backend="causal", device="cpu", batch_size=4, dtype="float32",
              max_length=seq_len, add_bos_token=False)
    assert hf.eot_token_id == eos and hf.max_length == seq_len
    theirs = _evaluate(hf, root)
    for task in TASKS:
        for key in ("acc,none", "acc_norm,none"):
            if key in ours["results"][task]:
                assert ours["results"][task][key] == theirs["results"][task][key], (task, key)
        a = sorted(ours["samples"][task], key=lambda s: s["doc_id"])
        b = sorted(theirs["samples"][task], key=lambda s: s["doc_id"])
        assert [s["doc_id"] for s in a] == [s["doc_id"] for s in b] and a
        for x, y in zip(a, b, strict=True):
            assert x["arguments"] == y["arguments"]  # the same prompts, few-shot examples included
            for (ll_x, greedy_x), (ll_y, greedy_y) in zip((r[0] for r in x["resps"]), (r[0] for r in y["resps"]),
                                                          strict=True):
                assert ll_x == pytest.approx(ll_y, abs=1e-4), (task, x["doc_id"])
                if task != "marin_next_word":  # a near-tie of two logits may flip argmax; the cloze has none here
                    assert greedy_x == greedy_y, (task, x["doc_id"])
