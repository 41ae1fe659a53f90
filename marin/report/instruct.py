"""The report's "Base and instruct" section: the base model (this report's) and the instruct model
fine-tuned from it, side by side on the held-out instructions, every number cited from the
ledger. Found through the index: the latest succeeded evaluate_instruct run whose ``base_model``
input is this report's model, the sft run that produced its ``instruct_model`` input, and the
instructions run that produced the sft run's instruction set. Absent when none exists."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from marin.evaluate.baselines import BETTER, SAME
from marin.ledger.query import Ledger
from marin.ledger.records import Record
from marin.ledger.store import RunLog
from marin.report.cited import latest_reader
from marin.report.facts import Context, Facts, esc, output
from marin.report.page import Page, V

MODELS = ("base", "instruct")
SAMPLES = 5  # held-out answers shown side by side
KEYS = ("exact_match", "containment", "choice_acc", "token_acc")


def _producer(ledger: Ledger, log: RunLog, name: str) -> RunLog | None:
    digest = next(i["digest"] for i in log.bodies("input") if i["name"] == name)
    found = [run for run, _ in ledger.producers_of(digest) if run.status == "succeeded"]
    return found[-1] if found else None


def facts(f: Facts, c: Context) -> dict[str, Any] | None:
    """The section's facts (ids), or None when no evaluate_instruct run read this report's model."""
    ledger = c.ledger
    model_digest = f.items[c.doc["model"]["folder_digest"]].value
    ev = latest_reader(ledger, {model_digest}, "base_model", "evaluate_instruct")
    if ev is None:
        return None
    evals = {r.body_as("eval")["name"]: r for r in ev.of_kind("eval")}
    rows = [{"model": m, **{k: f.cite(f"{m} held-out {k}", ev, evals[f"{m}_instructions"], f"/body/values/{k}/value").id
                            for k in ("exact_match", "containment")},
             "examples": f.cite(f"{m} held-out examples", ev, evals[f"{m}_instructions"], "/body/values/examples").id}
            for m in MODELS]
    samples = [{"prompt": f.cite("held-out prompt", ev, evals["base_instructions"], f"/body/samples/{i}/prompt").id,
                **{m: f.cite(f"{m} answer", ev, evals[f"{m}_instructions"], f"/body/samples/{i}/completion").id
                   for m in MODELS}}
               for i in range(min(SAMPLES, len(evals["base_instructions"].body_as("eval").get("samples", []))))]
    out: dict[str, Any] = {"run_id": ev.run_id, "rows": rows, "samples": samples, "tasks": _tasks(f, ev, evals)}
    sft = _producer(ledger, ev, "instruct_model")
    if sft is not None:
        model = output(sft, "model")
        out["sft"] = {"run_id": sft.run_id,
                      "recipe_digest": f.cite("sft recipe digest", sft, sft.start, "/body/recipe_digest").id,
                      "tensor_digest": f.cite("instruct tensor digest", sft, model, "/body/tensor_digest").id,
                      "steps": f.cite("sft steps", sft, sft.start, "/body/params/sft/steps").id,
                      "lr": f.cite("sft learning rate", sft, sft.start, "/body/params/sft/lr").id}
        instr = _producer(ledger, sft, "instructions")
        if instr is not None:
            out["instructions_run"] = instr.run_id
    return out


def _tasks(f: Facts, ev: RunLog, evals: dict[str, Record]) -> list[dict[str, Any]]:
    """By held-out task: each model's exact match and containment with stderr, the constant answer's,
    and each model's mark against it (derived facts); none for a run that recorded no tasks."""
    from marin.evaluate.baselines import MARK_HIGHER

    const = evals.get("constant_answer_instructions")
    if const is None:
        return []
    out: list[dict[str, Any]] = []
    values = const.body_as("eval")["values"]
    for task in sorted({k.split("/")[0] for k in values}):
        row: dict[str, Any] = {"task": task}
        for key in _keys(values, task):
            c = f.cite(f"{task} constant answer {key}", ev, const, f"/body/values/{esc(f'{task}/{key}')}/value")
            row[f"constant_{key}"] = c.id
            base = [c]
            if key == "choice_acc":  # marked against chance too: the share of 1 / choices
                chance = f.cite(f"{task} choice chance", ev, const,
                                f"/body/values/{esc(f'{task}/choice_chance')}/value")
                row["choice_chance"], base = chance.id, [c, chance]
            row[f"constant_{key}_answer"] = f.cite(f"{task} constant answer for {key}", ev, const,
                                                   f"/body/values/{esc(f'{task}/{key}_answer')}").id
            for m in MODELS:
                r = evals[f"{m}_instructions"]
                val = f.cite(f"{m} {task} {key}", ev, r, f"/body/values/{esc(f'{task}/{key}')}/value")
                se = f.cite(f"{m} {task} {key} stderr", ev, r, f"/body/values/{esc(f'{task}/{key}_stderr')}/value")
                row[f"{m}_{key}"], row[f"{m}_{key}_stderr"] = val.id, se.id
                row[f"{m}_{key}_mark"] = f.derive(f"{m} {task} {key} against the constant answer",
                                                  MARK_HIGHER, [val, se, *base]).id
        row["examples"] = f.cite(f"{task} held-out examples", ev, evals["base_instructions"],
                                 f"/body/values/{esc(f'{task}/examples')}").id
        out.append(row)
    return out


def _keys(values: Mapping[str, object], task: str) -> list[str]:
    """The scores a run recorded for ``task`` (choice accuracy since it was added)."""
    return [k for k in KEYS if f"{task}/{k}" in values]


def lines(p: Page) -> list[str]:
    """The section of report.md (nothing when there is no instruct model)."""
    v, sec = p.v, p.doc.get("instruct")
    if not sec:
        return []
    out = ["## Base and instruct", ""]
    if "sft" in sec:
        s = sec["sft"]
        out += [f"The instruct model (tensor digest {v(s['tensor_digest'])}) is this model fine-tuned on instructions "
                f"by sft run `{s['run_id']}` (recipe {v(s['recipe_digest'])}: {v(s['steps'])} steps at learning rate "
                f"{v(s['lr'])}, loss on the assistant tokens only)"
                + (f", on the instruction set of run `{sec['instructions_run']}`" if "instructions_run" in sec else "")
                + ". The card of `models/hf-instruct` names the instruction data's sources and digests; the "
                "licences of the curated documents the built-in instructions are cut from are in the Data section.", ""]
    out += [f"Held-out instructions (from the validation split), evaluate_instruct run `{sec['run_id']}`: greedy "
            "answers from the chat template's prompt. Exact match: the answer is the reference; containment: the "
            "reference is inside the answer. The base model never saw the chat format; its score is shown as it is.",
            "", "| model | exact match | containment | examples |", "|---|---|---|---|"]
    out += [f"| {r['model']} | {v(r['exact_match'])} | {v(r['containment'])} | {v(r['examples'])} |"
            for r in sec["rows"]]
    out += task_lines(v, sec.get("tasks") or [])
    out += ["", "| held-out instruction | base answer | instruct answer |", "|---|---|---|"]
    out += [f"| {v(x['prompt'])} | {v(x['base'])} | {v(x['instruct'])} |" for x in sec["samples"]]
    return [*out, ""]


def task_lines(v: V, tasks: list[dict[str, Any]]) -> list[str]:
    """The held-out results by task: the constant-answer baseline (one reference of the task given to
    every example) beside each model's score ± stderr and its mark."""
    if not tasks:
        return []
    out = ["", "By task: each score ± its stderr (sample standard deviation / sqrt(n), lm-eval's mean_stderr), "
           "beside the constant answer: the one reference of the task that, given to every example, scores "
           "best (chosen with the references in hand). Choice accuracy: the reference answer scored above up to three "
           "other answers of its task by log-likelihood after the prompt, as lm-eval scores multiple choice; its "
           "constant answer is the share of the most frequent reference, and it is marked against chance (1 / the "
           "choices) too. Token accuracy: the share of the reference's tokens that are the model's most likely next "
           "token given the prompt and the tokens before them; its constant answer is the best token sequence given "
           "to every example (chosen in hindsight). A score not beyond two stderr above its baselines is marked "
           f"**{SAME}**.", "",
           "| task | examples | metric | constant answer | its score | base | instruct |", "|" + "---|" * 7]
    for t in tasks:
        for key in [k for k in KEYS if f"constant_{k}" in t]:
            cells: list[str] = []
            for m in MODELS:
                shown = v(t[f"{m}_{key}_mark"])
                mark = f" **{shown}**" if BETTER not in shown else ""
                cells.append(f"{v(t[f'{m}_{key}'])} ± {v(t[f'{m}_{key}_stderr'])}{mark}")
            its = v(t[f"constant_{key}"]) + (f" (chance {v(t['choice_chance'])})" if key == "choice_acc" else "")
            out.append(f"| `{t['task']}` | {v(t['examples'])} | {key.replace('_', ' ')} | "
                       f"{v(t[f'constant_{key}_answer'])} | {its} | {' | '.join(cells)} |")
    return out
