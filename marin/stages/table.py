"""The pipeline's stages, each declared once: name, the function it runs, named data inputs and
outputs, params sections, what kind of work it does (:mod:`marin.stages.declaration`), and code
(its import closure and its function's, :mod:`marin.stages.closure`).

``dvc.yaml`` is generated from these declarations (``marin stages --write``, :mod:`marin.stages.dvcyaml`)
and checked against them (``marin stages --check``, and a test), so that DVC's idea of a stage's code is
the stage's real code: an edit to any module a stage imports makes ``dvc status`` report the
stage changed. The ledger records the same closure, file by file, in every run
(``run.started.code.closure``), which is how ``marin status`` names the module that made
an output stale. A stage's code takes its data paths from here (:meth:`Stage.input`, :meth:`Stage.out`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from marin.stages import closure
from marin.stages.declaration import Out, Stage

DVC_YAML = "dvc.yaml"
MODEL, INSTRUCT = "models/final", "models/instruct"  # the base model train writes, the instruct model sft writes
TOKENIZER, TEMPLATE = "data/tokens/tokenizer.json", "data/tokens/chat_template.jinja"
CURATED_TRAIN, INSTRUCTIONS_TRAIN = "data/curated/train.parquet", "data/instructions/train.jsonl"
INSTRUCTIONS_MANIFEST = "data/instructions/manifest.json"
EVAL, INSTRUCT_EVAL = "metrics/eval.json", "metrics/instruct_eval.json"
# Beside each metrics file, what its measurements are measured against and how (marin/evaluate/metrics_file.py)
EVAL_CONTEXT, INSTRUCT_EVAL_CONTEXT = "evals/eval_context.json", "evals/instruct_eval_context.json"
TRACE_SAMPLES, TRACE_INSTRUCT = "evals/trace/samples.json", "evals/trace/instruct.json"


RUNTIME_TRAIN = ("runtime.xla_cpu_threads", "runtime.devices", "runtime.processes", "runtime.param_sharding",
                 "runtime.determinism")

# What every stage does after its run, named as a stage names its function: mirror the ledger into the
# MLflow view (marin.tracking, which reads the declarations: named here, not imported).
MIRROR = "marin.tracking:sync_quietly"

STAGES: tuple[Stage, ...] = (
    Stage("fetch", "marin.data.fetch_stage:run_stage", params=("fetch",), outs=(Out("raw", "data/raw"),),
          fetches=True),
    Stage("curate", "marin.data.curate_stage:run_stage", {"raw": "data/raw"}, params=("fetch", "curate"),
          outs=(Out("curated", "data/curated"),)),
    Stage("evalsets", "marin.data.evalsets_stage:run_stage", {"curated": "data/curated"},
          outs=(Out("evalsets", "data/evalsets"),),
          note="the built-in harness tasks' data, cut from the validation split only"),
    Stage("tokenize", "marin.data.tokenize_stage:run_stage", {"curated": "data/curated", "tokenizer": "tokenizer"},
          params=("tokenize",), outs=(Out("tokens", "data/tokens"),),
          dep_notes={"tokenizer": "a pretrained tokenizer.json (tokenize.pretrained.path) lies here"}),
    Stage("train", "marin.train.train_stage:run_stage", {"tokens": "data/tokens"},
          params=("seed", "model", "train", *RUNTIME_TRAIN),
          outs=(Out("model", MODEL), Out("curve", "metrics/train_curve.csv", "plots")), uses_jax=True, trains=True),
    Stage("instructions", "marin.instruct.instructions_stage:run_stage", {"curated": "data/curated", "raw": "data/raw"},
          params=("fetch", "curate", "instructions"), outs=(Out("instructions", "data/instructions"),),
          note="built-in instructions from the curated splits, and your own (fetch sources of format messages)"),
    Stage("sft", "marin.instruct.sft_stage:run_stage",
          {"base_model": MODEL, "tokenizer": TOKENIZER, "chat_template": TEMPLATE, "instructions": "data/instructions"},
          params=("seed", "sft", *RUNTIME_TRAIN),
          outs=(Out("model", INSTRUCT), Out("curve", "metrics/sft_curve.csv", "plots")), uses_jax=True, trains=True,
          note=f"{MODEL} fine-tuned on the instruction set, loss on assistant tokens (marin/instruct/sft.py)"),
    Stage("decontaminate", "marin.evaluate.decontaminate_stage:run_stage",
          {"curated_train": CURATED_TRAIN, "instructions_train": INSTRUCTIONS_TRAIN, "evalsets": "data/evalsets"},
          params=("decontaminate", "evaluate.harness"), outs=(Out("decontamination", "data/decontamination.json"),),
          note="each harness item's 13-grams against the training data: the contaminated ones, by task",
          task_deps=True),
    Stage("trace_index", "marin.evaluate.trace_index_stage:run_stage",
          {"tokens": "data/tokens", "curated_train": CURATED_TRAIN, "instructions_train": INSTRUCTIONS_TRAIN,
           "instructions_manifest": INSTRUCTIONS_MANIFEST},
          params=("trace",), outs=(Out("trace_index", "data/trace_index"),),
          note="a suffix array of the training tokens and instruction set, with a document table: `marin trace`"),
    Stage("evaluate", "marin.evaluate.evaluate_stage:run_stage",
          {"model": MODEL, "tokens": "data/tokens", "evalsets": "data/evalsets",
           "decontamination": "data/decontamination.json", "trace_index": "data/trace_index"},
          params=("evaluate", "trace.min_tokens", "runtime.xla_cpu_threads", "runtime.determinism"),
          outs=(Out("eval_metrics", EVAL, "metrics"), Out("eval_context", EVAL_CONTEXT),
                Out("harness_results", "evals/harness/results.json"),
                Out("harness_samples", "evals/harness/samples.jsonl"), Out("trace_samples", TRACE_SAMPLES)),
          dep_notes={"data/evalsets": "the built-in harness tasks' data; their YAMLs are package data, code",
                     "data/decontamination.json": "evaluate.decontaminate: report or exclude its items",
                     "data/trace_index": "the greedy samples traced to the training documents"},
          task_deps=True, uses_jax=True),
    Stage("evaluate_instruct", "marin.evaluate.evaluate_instruct_stage:run_stage",
          {"base_model": MODEL, "instruct_model": INSTRUCT, "tokenizer": TOKENIZER, "chat_template": TEMPLATE,
           "instructions": "data/instructions", "trace_index": "data/trace_index"},
          params=("instructions.eval_tokens", "trace.min_tokens", "runtime.xla_cpu_threads", "runtime.determinism"),
          outs=(Out("instruct_eval_metrics", INSTRUCT_EVAL, "metrics"),
                Out("instruct_eval_context", INSTRUCT_EVAL_CONTEXT), Out("trace_instruct", TRACE_INSTRUCT)),
          note="base and instruct answer the held-out instructions: exact match, containment; answers traced",
          uses_jax=True),
    Stage("export", "marin.export.export_stage:run_stage",
          {"model": MODEL, "tokenizer": TOKENIZER, "eval": EVAL, "eval_context": EVAL_CONTEXT},
          params=("report", "fetch", "evaluate"), outs=(Out("hf_model", "models/hf"),),
          note="the model as a Hugging Face Llama checkpoint, tokenizer and model card beside it",
          dep_notes={EVAL: "the card's evaluation results"}),
    Stage("export_instruct", "marin.export.export_instruct_stage:run_stage",
          {"model": INSTRUCT, "tokenizer": TOKENIZER, "chat_template": TEMPLATE,
           "instructions_manifest": INSTRUCTIONS_MANIFEST, "instruct_eval": INSTRUCT_EVAL,
           "instruct_eval_context": INSTRUCT_EVAL_CONTEXT},
          params=("report",), outs=(Out("hf_model", "models/hf-instruct"),),
          note="the instruct model for transformers: chat template in tokenizer_config.json, README.md card"),
    Stage("report", "marin.report.report_stage:run_stage",
          {"model": MODEL, "hf_model": "models/hf", "eval": EVAL, "instruct_eval": INSTRUCT_EVAL,
           "trace_samples": TRACE_SAMPLES, "trace_instruct": TRACE_INSTRUCT},
          params=("report",), outs=(Out("report", "reports/${report.model_name}"),),
          note="a ledger run too; signed when the key exists (`marin keygen`), else written unsigned",
          dep_notes={"models/hf": "after the export: the report's \"How to use\" loads it",
                     INSTRUCT_EVAL: "after evaluate_instruct: its \"Base and instruct\" section"}),
)
NAMES = tuple(s.name for s in STAGES)
TRAINING = tuple(s.name for s in STAGES if s.trains)  # checkpoints, segments, resume
SOURCE_STAGES = tuple(s.name for s in STAGES if s.fetches)  # their inputs come from outside the ledger
CLI_MODULE = "marin.cli"  # the entry point of runs that no pipeline stage makes (publish)

SHOWS_REFERENCES = ("report",)  # stages that show the references' scores: they run after every reference stage
REFERENCE = "reference_"  # a stage per evaluate.references entry: reference_<name> (pipeline/reference.py)
REFERENCE_FN = "marin.evaluate.reference_stage:run_stage"


def reference(name: str, path: str) -> Stage:
    """The stage that scores the Hugging Face model folder ``path`` beside ours (marin.evaluate.reference_stage)."""
    return Stage(f"{REFERENCE}{name}", REFERENCE_FN,
                 {"model": path, "text": "data/curated/validation.parquet", "evalsets": "data/evalsets",
                  "decontamination": "data/decontamination.json"},
                 params=("evaluate.harness", "evaluate.decontaminate"),
                 outs=(Out("reference_metrics", f"metrics/reference/{name}.json", "metrics"),
                       Out("reference_context", f"evals/reference/{name}.json")),
                 note=f"evaluate.references {name}: lm-eval's hf model on evaluate's requests, bits per byte",
                 dep_notes={path: "the model folder, pinned by its tree digest"},
                 task_deps=True, entry="reference", args=name)


def declared(root: Path) -> tuple[Stage, ...]:
    """The stages of the project at ``root``: :data:`STAGES`, then one per reference model that its
    params.yaml lists (none without one). With references, a stage that declares the whole ``evaluate``
    section declares its keys but ``references`` instead (DVC compares a section whole: a new pin
    would rerun evaluate and export)."""
    from marin import config
    from marin.params_file import read_yaml

    path = Path(root) / "params.yaml"
    if not path.is_file():
        return STAGES
    given = read_yaml(path)
    loaded = config.parse(given, str(path))
    if not loaded.evaluate.references:
        return STAGES
    # the keys params.yaml spells out (DVC refuses one it lacks); it has `evaluate`: no default lists references
    keys = tuple(f"evaluate.{k}" for k in given["evaluate"] if k != "references")

    refs = tuple(reference(r.name, r.path) for r in loaded.evaluate.references)
    shown = {f"{r.name}_metrics": r.out("reference_metrics").as_posix() for r in refs}  # the report's references table

    def narrow(s: Stage) -> Stage:
        s = replace(s, params=tuple(p for x in s.params for p in (keys if x == "evaluate" else (x,))))
        return replace(s, inputs={**s.inputs, **shown}) if s.name in SHOWS_REFERENCES else s

    return (*map(narrow, STAGES), *refs)


def get(name: str) -> Stage | None:
    return next((s for s in STAGES if s.name == name), None)


def declaration(name: str) -> Stage:
    """The declaration of the pipeline stage ``name`` (a stage's code reads its paths from it)."""
    s = get(name)
    if s is None:
        raise KeyError(f"no stage {name!r} in marin/stages/table.py")
    return s


def entry_modules(stage: str) -> tuple[str, ...]:
    """The modules whose import closures are the code of a run of ``stage``: its pipeline/ script and
    the module of the function it runs (the CLI's, for runs no pipeline stage makes)."""
    if stage.startswith(REFERENCE):
        return "pipeline.reference", REFERENCE_FN.partition(":")[0]
    s = get(stage)
    return (s.module, s.fn_module) if s is not None else (CLI_MODULE,)


def code_files(root: Path, stage: str) -> list[str]:
    """Every file of ``stage``'s code closure (project-relative, sorted)."""
    return closure.files(root, *entry_modules(stage))
