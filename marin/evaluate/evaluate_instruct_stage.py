"""Stage evaluate_instruct: the base model (models/final) and the instruct model (models/instruct)
answer the held-out instructions (data/instructions/heldout.jsonl), greedily, from the chat
template's prompt; each answer is scored by exact match (the answer, stripped, is the reference)
and containment (the reference is inside the answer, case folded), and each example as multiple
choice among other references of its task (``choice_acc``, :mod:`marin.evaluate.instruct_choice`),
and token by token (``token_acc``, :mod:`marin.evaluate.instruct_tokens`): the share of the
reference's tokens the model predicts given the ones before, the measure that separates a trained
model from a less trained one long before exact match does. Writes
metrics/instruct_eval.json (DVC metrics) and one eval record per model with every answer.

A stage of its own beside evaluate, so the base model's evaluation does not wait for a fine-tune;
both models answer the same prompts with the same decoding. Generation stops at ``<|end|>`` or
the end-of-text token, else after ``instructions.eval_tokens`` tokens: the base model never saw
``<|end|>`` and runs to the limit, which its score shows as it is.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from marin import readers, stages
from marin.config import Params, RuntimeParams
from marin.data import chat
from marin.errors import StageError
from marin.evaluate import metrics_file
from marin.ledger.bodies import Sample
from marin.train import runtime

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from marin.evaluate.universal_scoring import Rounder
    from marin.model.weights import Loaded

_DECLARED = stages.declaration("evaluate_instruct")  # the paths below: marin/stages/table.py
MODELS = {"base": _DECLARED.input("base_model"), "instruct": _DECLARED.input("instruct_model")}
TOKENIZER, TEMPLATE = _DECLARED.input("tokenizer"), _DECLARED.input("chat_template")
HELDOUT, METRICS = _DECLARED.input("instructions") / "heldout.jsonl", _DECLARED.out("instruct_eval_metrics")
CONTEXT = _DECLARED.out("instruct_eval_context")  # the example counts (marin.evaluate.metrics_file)
TRACE = _DECLARED.out("trace_instruct")  # both models' answers traced to the training documents (marin trace)
BATCH = 32  # prompts answered at a time: (BATCH, seq_len, vocab) logits per step
SCORES = (("exact_match", "exact"), ("containment", "contained"), ("choice_acc", "choice"),
          ("token_acc", "tokens"))  # value key, row key


def greedy_batch(logits_fn: Any, params: Any, prompts: list[np.ndarray], pad_id: int, stop: set[int],
                 seq_len: int, n: int) -> list[list[int]]:
    """Greedy answers of a batch of prompts, each until a ``stop`` token (kept) or ``n`` tokens; a
    fixed (len(prompts), seq_len) buffer, right-padded (causal attention: padding changes nothing
    before it), each row's last ``seq_len`` tokens."""
    outs: list[list[int]] = [[] for _ in prompts]
    for _ in range(n):
        live = [i for i, o in enumerate(outs) if not (o and o[-1] in stop)]
        if not live:
            break
        windows = [np.concatenate([p, np.array(o, np.int32)])[-seq_len:] for p, o in zip(prompts, outs, strict=True)]
        buf = np.full((len(prompts), seq_len), pad_id, dtype=np.int32)
        for i, w in enumerate(windows):
            buf[i, : len(w)] = w
        logits = np.asarray(logits_fn(params, buf))
        for i in live:
            outs[i].append(int(logits[i, len(windows[i]) - 1].argmax()))
    return outs


def score(answer: str, reference: str) -> tuple[bool, bool]:
    """(exact match, containment) of one answer."""
    return answer.strip() == reference.strip(), reference.strip().casefold() in answer.casefold()


def answer_all(model: Loaded, tok: Tokenizer, examples: list[dict[str, Any]], n: int,
               rounder: Rounder | None = None) -> list[dict[str, Any]]:
    """Every example's prompt, answer text, answer ids (through the stop token) and scores (universal:
    ``rounder``, the model's float64 logits rounded with the log, marin.evaluate.universal_scoring)."""
    from marin.evaluate import instruct_tokens as it
    from marin.evaluate.universal_scoring import logits_fn as make_logits_fn

    graphdef, params, config = model
    eos_id, seq_len = config["tokenizer"]["eos_id"], config["model"]["max_seq_len"]
    eos, end_id = chat.token_of(tok, eos_id), chat.special_id(tok, chat.END)
    logits_fn = make_logits_fn(graphdef, rounder)
    prompts = [chat.prompt_ids(tok, e["messages"][:-1], eos) for e in examples]
    ids: list[list[int]] = []
    for i in range(0, len(prompts), BATCH):
        ids += greedy_batch(logits_fn, params, prompts[i:i + BATCH], eos_id, {eos_id, end_id}, seq_len, n)
    chosen = choices_right(model, tok, examples, rounder)
    known = it.hits(logits_fn, params, it.answer_ids(tok, examples, eos), eos_id, seq_len)
    rows = []
    for e, out, right, tokens in zip(examples, ids, chosen, known, strict=True):
        text = tok.decode([t for t in out if t not in (eos_id, end_id)])
        exact, contained = score(text, e["messages"][-1]["content"])
        rows.append({"task": e["task"], "prompt": e["messages"][-2]["content"], "completion": text,
                     "token_ids": out, "exact": exact, "contained": contained, "choice": right,
                     "tokens": tokens})
    return rows


def choices_right(model: Loaded, tok: Tokenizer, examples: list[dict[str, Any]],
                  rounder: Rounder | None = None) -> list[bool]:
    """Per example, whether the model scores its reference above the task's other answers
    (:mod:`marin.evaluate.instruct_choice`), through the harness adapter's log-likelihoods."""
    from marin.evaluate import instruct_choice as ic
    from marin.evaluate.harness import MarinLM

    graphdef, params, config = model
    eos_id, seq_len = config["tokenizer"]["eos_id"], config["model"]["max_seq_len"]
    lm = MarinLM(graphdef, params, tok, eos_id, seq_len, batch_size=BATCH, rounder=rounder)
    choices = ic.options(examples)
    reqs = ic.requests(tok, examples, choices, chat.token_of(tok, eos_id))
    return ic.correct(choices, [ll for ll, _ in lm._loglikelihood_tokens(reqs)])


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Exact match and containment, whole and per task (fractions of the examples)."""
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_task[r["task"]].append(r)

    def rates(rs: list[dict[str, Any]]) -> dict[str, Any]:
        return {**{key: sum(r[col] for r in rs) / max(len(rs), 1) for key, col in SCORES}, "examples": len(rs)}

    return {**rates(rows), "by_task": {t: rates(rs) for t, rs in sorted(by_task.items())}}


def task_values(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per task (``<task>/<key>``): exact match, containment and choice accuracy with their stderrs
    (lm-eval's mean_stderr over the 0/1 scores) and the number of examples."""
    from marin.evaluate.baselines import mean_stderr
    from marin.ledger import exact

    out: dict[str, Any] = {}
    for task in sorted({r["task"] for r in rows}):
        rs = [r for r in rows if r["task"] == task]
        for key, col in SCORES:
            xs = [float(r[col]) for r in rs]
            out[f"{task}/{key}"], out[f"{task}/{key}_stderr"] = exact(sum(xs) / len(xs)), exact(mean_stderr(xs))
        out[f"{task}/examples"] = len(rs)
    return out


def constant_values(examples: list[dict[str, Any]], tok: Tokenizer, eos: str) -> dict[str, Any]:
    """Per task, the constant-answer baseline: the best exact match and containment of one answer,
    a reference of the task, given to every example (chosen with the references in hand), and that
    answer; for choice accuracy, the share of the most frequent reference and, beside it, chance
    (``choice_chance``: the mean of 1 / choices); for token accuracy, the best constant token
    sequence's (:func:`marin.evaluate.instruct_tokens.constant`), and its text."""
    from marin.evaluate import instruct_choice as ic
    from marin.evaluate import instruct_tokens as it
    from marin.ledger import exact

    out: dict[str, Any] = {}
    choices = ic.options(examples)
    answers = [a for _, a in it.answer_ids(tok, examples, eos)]
    for task in sorted({e["task"] for e in examples}):
        refs = [e["messages"][-1]["content"] for e in examples if e["task"] == task]
        for key in ("exact_match", "containment"):  # choice_acc below
            best = max(sorted(set(refs)), key=lambda a, k=key: sum(score(a, r)[k == "containment"] for r in refs))
            out[f"{task}/{key}"] = exact(sum(score(best, r)[key == "containment"] for r in refs) / len(refs))
            out[f"{task}/{key}_answer"] = best
        mine = [e for e in examples if e["task"] == task]
        share, answer = ic.constant(mine)
        out[f"{task}/choice_acc"], out[f"{task}/choice_acc_answer"] = exact(share), answer
        out[f"{task}/choice_chance"] = exact(ic.chance([c for e, c in zip(examples, choices, strict=True)
                                                        if e["task"] == task]))
        value, seq = it.constant([a for e, a in zip(examples, answers, strict=True) if e["task"] == task])
        out[f"{task}/token_acc"], out[f"{task}/token_acc_answer"] = exact(value), tok.decode(seq)
    return out


def task_lines(by_model: dict[str, dict[str, Any]], constant: dict[str, Any]) -> list[str]:
    """The terminal's summary, one line per task: each score by model (``base → instruct``) beside
    the constant answer's, then the scores that are not better than baseline, each named once."""
    from marin.evaluate import baselines as bl

    models, out = list(by_model), []
    for task in sorted({k.split("/")[0] for k in constant}):
        scores, marks = [], {}
        for key, _ in SCORES:
            c, label = constant[f"{task}/{key}"]["value"], key.replace("_", " ")
            vals = {m: (v[f"{task}/{key}"]["value"], v[f"{task}/{key}_stderr"]["value"]) for m, v in by_model.items()}
            base = [c, *([constant[f"{task}/choice_chance"]["value"]] if key == "choice_acc" else [])]
            where = {m: bl.mark(v, se, "higher", base) for m, (v, se) in vals.items()}
            scores.append(f"{label} {' → '.join(f'{v:.3f}' for v, _ in vals.values())} ({c:.3f})")
            for w in dict.fromkeys(where.values()):
                who = [m for m in models if where[m] == w]
                if w is not None and w != bl.BETTER:
                    marks.setdefault(w, []).append(label + ("" if len(who) == len(models) else f" ({', '.join(who)})"))
        n = by_model[models[0]][f"{task}/examples"]
        out.append(f"evaluate_instruct: {task}, {n} examples, {' → '.join(models)} (constant answer): "
                   + ", ".join(scores) + "".join(f"; {w}: {', '.join(ls)}" for w, ls in marks.items()))
    return out


def _sample(row: dict[str, Any]) -> Sample:
    """The part of an answered row an eval record keeps."""
    return {"prompt": row["prompt"], "completion": row["completion"], "token_ids": row["token_ids"]}


def run_stage(root: Path, params: Params) -> None:
    """Both models on the held-out instructions, recorded as a ledger run."""
    rt = RuntimeParams(params.runtime.xla_cpu_threads, 1, "replicated", determinism=params.runtime.determinism)
    runtime.configure(rt)
    import jax  # noqa: F401  # before the fingerprint, as evaluate does

    from marin import env
    from marin.data import tokenize as tk
    from marin.evaluate import tracing, universal_scoring
    from marin.instruct.instructions_stage import section
    from marin.ledger import Input, Recipe, Run, exact
    from marin.model import weights

    n = section(params).eval_tokens
    fp = env.fingerprint()
    inputs = [Input("base_model", MODELS["base"].as_posix()), Input("instruct_model", MODELS["instruct"].as_posix()),
              Input("tokenizer", TOKENIZER.as_posix()), Input("chat_template", TEMPLATE.as_posix()),
              Input("heldout_instructions", HELDOUT.as_posix())]
    if tracing.indexed(root):  # else the trace file says the answers were not traced
        inputs.append(Input("trace_index", tracing.INDEX.as_posix()))
    recorded = {"instructions": {"eval_tokens": n},
                "runtime": {"xla_cpu_threads": rt.xla_cpu_threads, "determinism": params.runtime.determinism},
                "trace": {"min_tokens": params.trace.min_tokens}}
    with Run.start(root, Recipe("evaluate_instruct", recorded, inputs,
                                 closure=stages.code_files(root, "evaluate_instruct"),
                                 det_class=runtime.determinism_class(rt, fp), fingerprint=fp)) as run, \
            universal_scoring.stage_log(root, run, "evaluate_instruct", rt.determinism) as rounder:
        tok = tk.load(root / TOKENIZER)
        examples = [json.loads(x) for x in readers.lines(root / HELDOUT, "conversations", StageError) if x.strip()]
        metrics: dict[str, Any] = {}
        loaded = {name: weights.load(root / path) for name, path in MODELS.items()}
        if rounder is not None:  # universal: float64 from the float32 weights
            loaded = {name: universal_scoring.wide_model(m) for name, m in loaded.items()}
        constant = constant_values(examples, tok, chat.token_of(tok, loaded["base"][2]["tokenizer"]["eos_id"]))
        run.record("eval", {"name": "constant_answer_instructions", "split": "heldout_instructions",
                            "values": constant})
        answers: dict[str, list[Sample]] = {}
        by_model: dict[str, dict[str, Any]] = {}  # each model's recorded values, for the terminal's summary
        for name, model in loaded.items():
            rows = answer_all(model, tok, examples, n, rounder)
            answers[f"{name}_instructions"] = [_sample(r) for r in rows]
            metrics[name] = s = summary(rows)
            values = {**{key: exact(s[key]) for key, _ in SCORES},
                      "examples": len(rows), "tokens_per_answer": n, **task_values(rows)}
            run.record("eval", {"name": f"{name}_instructions", "split": "heldout_instructions", "values": values,
                                "samples": answers[f"{name}_instructions"]})
            print(f"evaluate_instruct: {name}: exact match {s['exact_match']:.3f}, containment "
                  f"{s['containment']:.3f}, choice accuracy {s['choice_acc']:.3f}, token accuracy {s['token_acc']:.3f} "
                  f"on {len(rows)} held-out instructions")
            by_model[name] = values
        for line in task_lines(by_model, constant):  # one line per task, every model in it
            print(line)
        tracing.record_samples(root, run, answers, TRACE, params.trace.min_tokens)
        metrics_file.write(root, run, metrics, ("instruct_eval_metrics", METRICS), ("instruct_eval_context", CONTEXT),
                           metrics_file.instructions_headline)
