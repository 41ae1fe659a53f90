"""The pipeline's stages, each declared once: name, command, data inputs, params sections,
outputs, and code (its import closure, :mod:`marin.closure`).

``dvc.yaml`` is generated from these declarations (``marin stages --write``, :mod:`marin.dvcyaml`)
and checked against them (``marin stages --check``, and a test), so that DVC's idea of a stage's code is
the stage's real code: an edit to any module a stage imports makes ``dvc status`` report the
stage changed. The ledger records the same closure, file by file, in every run
(``run.started.code.closure``), which is how ``marin status`` names the module that made an
output stale.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from marin import closure

DVC_YAML = "dvc.yaml"
MODEL, INSTRUCT = "models/final", "models/instruct"  # the base model train writes, the instruct model sft writes


@dataclass(frozen=True)
class Out:
    path: str
    kind: str = "outs"  # outs | plots | metrics (the last two: small files, cache: false; a plots file is drawn
    #                     by dvc.yaml's top-level plots against its step column, marin.dvcyaml.PLOTS)


@dataclass(frozen=True)
class Stage:
    name: str
    deps: tuple[str, ...] = ()  # data inputs (paths), besides the code closure
    params: tuple[str, ...] = ()
    outs: tuple[Out, ...] = ()
    note: str = ""  # one line, written as a comment beside the stage in dvc.yaml
    dep_notes: dict[str, str] = field(default_factory=dict)
    task_deps: bool = False  # also the lab's harness task folders and data files (marin.evaluate.task_files)
    entry: str = ""  # the pipeline/ module, where it is not the stage's name (the reference stages)
    args: str = ""  # after the module in the command

    @property
    def module(self) -> str:
        return f"pipeline.{self.entry or self.name}"

    @property
    def cmd(self) -> str:
        return f"python -m {self.module}" + (f" {self.args}" if self.args else "")


RUNTIME_TRAIN = ("runtime.xla_cpu_threads", "runtime.devices", "runtime.processes", "runtime.param_sharding",
                 "runtime.determinism")

STAGES: tuple[Stage, ...] = (
    Stage("fetch", params=("fetch",), outs=(Out("data/raw"),)),
    Stage("curate", deps=("data/raw",), params=("fetch", "curate"), outs=(Out("data/curated"),)),
    Stage("evalsets", deps=("data/curated",), outs=(Out("data/evalsets"),),
          note="the built-in harness tasks' data, cut from the validation split only"),
    Stage("tokenize", deps=("data/curated", "tokenizer"), params=("tokenize",), outs=(Out("data/tokens"),),
          dep_notes={"tokenizer": "a pretrained tokenizer.json (tokenize.pretrained.path) lies here"}),
    Stage("train", deps=("data/tokens",), params=("seed", "model", "train", *RUNTIME_TRAIN),
          outs=(Out(MODEL), Out("metrics/train_curve.csv", "plots"))),
    Stage("instructions", deps=("data/curated", "data/raw"), params=("fetch", "curate", "instructions"),
          outs=(Out("data/instructions"),),
          note="built-in instructions from the curated splits, and your own (fetch sources of format messages)"),
    Stage("sft", deps=(MODEL, "data/tokens/tokenizer.json", "data/tokens/chat_template.jinja",
                       "data/instructions"),
          params=("seed", "sft", *RUNTIME_TRAIN), outs=(Out(INSTRUCT), Out("metrics/sft_curve.csv", "plots")),
          note="models/final fine-tuned on the instruction set, loss on assistant tokens (marin/instruct/sft.py)"),
    Stage("decontaminate", deps=("data/curated/train.parquet", "data/instructions/train.jsonl", "data/evalsets"),
          params=("decontaminate", "evaluate.harness"), outs=(Out("data/decontamination.json"),),
          note="each harness item's 13-grams against the training data: the contaminated ones, by task",
          task_deps=True),
    Stage("trace_index", deps=("data/tokens", "data/curated/train.parquet", "data/instructions/train.jsonl",
                               "data/instructions/manifest.json"),
          params=("trace",), outs=(Out("data/trace_index"),),
          note="a suffix array of the training tokens and instruction set, with a document table: `marin trace`"),
    Stage("evaluate", deps=(MODEL, "data/tokens", "data/evalsets", "data/decontamination.json", "data/trace_index"),
          params=("evaluate", "trace.min_tokens", "runtime.xla_cpu_threads", "runtime.determinism"),
          outs=(Out("metrics/eval.json", "metrics"), Out("evals/harness/results.json"),
                Out("evals/harness/samples.jsonl"), Out("evals/trace/samples.json")),
          dep_notes={"data/evalsets": "the built-in harness tasks' data; their YAMLs are package data, code",
                     "data/decontamination.json": "evaluate.decontaminate: report or exclude its items",
                     "data/trace_index": "the greedy samples traced to the training documents"},
          task_deps=True),
    Stage("evaluate_instruct", deps=(MODEL, INSTRUCT, "data/tokens/tokenizer.json",
                                     "data/tokens/chat_template.jinja", "data/instructions", "data/trace_index"),
          params=("instructions.eval_tokens", "trace.min_tokens", "runtime.xla_cpu_threads", "runtime.determinism"),
          outs=(Out("metrics/instruct_eval.json", "metrics"), Out("evals/trace/instruct.json")),
          note="base and instruct answer the held-out instructions: exact match, containment; answers traced"),
    Stage("export", deps=(MODEL, "data/tokens/tokenizer.json", "metrics/eval.json"),
          params=("report", "fetch", "evaluate"), outs=(Out("models/hf"),),
          note="the model as a Hugging Face Llama checkpoint, tokenizer and model card beside it",
          dep_notes={"metrics/eval.json": "the card's evaluation results"}),
    Stage("export_instruct", deps=(INSTRUCT, "data/tokens/tokenizer.json", "data/tokens/chat_template.jinja",
                                   "data/instructions/manifest.json", "metrics/instruct_eval.json"),
          params=("report",),
          outs=(Out("models/hf-instruct"),),
          note="the instruct model for transformers: chat template in tokenizer_config.json, README.md card"),
    Stage("report", deps=(MODEL, "models/hf", "metrics/eval.json", "metrics/instruct_eval.json",
                          "evals/trace/samples.json", "evals/trace/instruct.json"),
          params=("report",),
          outs=(Out("reports/${report.model_name}"),),
          note="a ledger run too; signed when the key exists (`marin keygen`), else written unsigned",
          dep_notes={"models/hf": "after the export: the report's \"How to use\" loads it",
                     "metrics/instruct_eval.json": "after evaluate_instruct: its \"Base and instruct\" section"}),
)
NAMES = tuple(s.name for s in STAGES)
TRAINING = ("train", "sft")  # the stages that run marin.train.loop: checkpoints, segments, resume
CLI_MODULE = "marin.cli"  # the entry point of runs that no pipeline stage makes (publish)

REFERENCE = "reference_"  # a stage per evaluate.references entry: reference_<name> (pipeline/reference.py)


def reference(name: str, path: str) -> Stage:
    """The stage that scores the Hugging Face model folder ``path`` beside ours (marin.evaluate.reference_stage)."""
    return Stage(f"{REFERENCE}{name}", deps=(path, "data/curated/validation.parquet", "data/evalsets",
                                             "data/decontamination.json"),
                 params=("evaluate.harness", "evaluate.decontaminate"),
                 outs=(Out(f"metrics/reference/{name}.json", "metrics"),),
                 note=f"evaluate.references {name}: lm-eval's hf model on evaluate's requests, bits per byte",
                 dep_notes={path: "the model folder, pinned by its tree digest"},
                 task_deps=True, entry="reference", args=name)


def declared(root: Path) -> tuple[Stage, ...]:
    """The stages of the project at ``root``: :data:`STAGES`, then one per reference model that its
    params.yaml lists (none without one). With references, a stage that declares the whole ``evaluate``
    section declares its keys but ``references`` instead (DVC compares a section whole: a new pin
    would rerun evaluate and export)."""
    from marin import config

    path = Path(root) / "params.yaml"
    loaded = config.load(path) if path.is_file() else None
    if loaded is None or not loaded.evaluate.references:
        return STAGES
    keys = tuple(f"evaluate.{k}" for k in loaded.raw["evaluate"] if k != "references")

    def narrow(s: Stage) -> Stage:
        return replace(s, params=tuple(p for x in s.params for p in (keys if x == "evaluate" else (x,))))

    return (*map(narrow, STAGES), *(reference(r.name, r.path) for r in loaded.evaluate.references))


def get(name: str) -> Stage | None:
    return next((s for s in STAGES if s.name == name), None)


def entry_module(stage: str) -> str:
    """The module whose import closure is the code of a run of ``stage``."""
    if stage.startswith(REFERENCE):
        return "pipeline.reference"
    s = get(stage)
    return s.module if s is not None else CLI_MODULE


def code_files(root: Path, stage: str) -> list[str]:
    """Every file of ``stage``'s code closure (project-relative, sorted)."""
    return closure.files(root, entry_module(stage))
