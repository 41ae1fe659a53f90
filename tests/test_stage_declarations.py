"""The stage declarations (marin/stages/table.py) hold together: every input is an earlier stage's
output (or a folder the lab fills), each stage's function is importable and runs under its own
declaration, and ``marin report`` runs through the same runtime as every stage (leftovers removed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from marin import stages
from marin.errors import StageError
from tests.conftest import REPO

LAB_FOLDERS = ("tokenizer",)  # inputs no stage writes: a pretrained tokenizer.json the lab puts there


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + "/")


def test_every_input_is_an_earlier_stages_output() -> None:
    written: list[str] = []
    for s in stages.STAGES:
        for name, path in s.inputs.items():
            assert path in LAB_FOLDERS or any(_under(path, o) for o in written), f"{s.name}: input {name} {path}"
        written += [o.path for o in s.outs]
    assert len(written) == len(set(written)), "two stages declare one output"


def test_names_within_a_stage_are_unique_and_lookups_name_the_stage() -> None:
    for s in stages.STAGES:
        assert len({o.name for o in s.outs}) == len(s.outs), s.name
        assert len(set(s.inputs.values())) == len(s.inputs), s.name
    with pytest.raises(StageError, match="stage train declares no output 'nope'"):
        stages.declaration("train").out("nope")
    assert stages.TRAINING == ("train", "sft") and stages.SOURCE_STAGES == ("fetch",)


def test_a_stage_function_reads_its_declaration_only_while_it_runs() -> None:
    from marin.stages.declaration import running

    with pytest.raises(StageError, match="no stage is running"):
        stages.current()
    report = stages.declaration("report")
    with running(report):
        assert stages.current() is report
    for s in stages.STAGES:
        assert callable(s.function()), s.fn


def test_marin_report_removes_a_leftover_temp_folder_beside_a_declared_output(tmp_path: Path) -> None:
    """`marin report` is the report stage's declaration run by the stage runtime: like every stage's start, it
    removes what a killed run left beside any declared output, before the report itself (which fails here:
    nothing was trained)."""
    for name in ("params.yaml", "dvc.yaml"):
        (tmp_path / name).write_bytes((REPO / name).read_bytes())
    leftover = tmp_path / "models" / ".final.k1lled00.tmp"  # what fsutil.atomic_dir names its temporary folder
    (leftover / "weights").mkdir(parents=True)
    kept = tmp_path / "models" / "final"
    kept.mkdir()
    r = subprocess.run([sys.executable, "-m", "marin.cli", "--root", str(tmp_path), "report"], capture_output=True,
                       text=True, cwd=tmp_path)
    assert "marin: removed models/.final.k1lled00.tmp" in r.stderr, r.stderr
    assert not leftover.exists() and kept.is_dir()
    assert r.returncode != 0 and "marin: error:" in r.stderr  # then the report refuses: no train run recorded


@pytest.mark.parametrize("keys, given, expected", [
    (("runtime.devices", "runtime.determinism"), {"runtime": {}}, ["runtime"]),  # defaults: the section whole
    (("runtime.devices", "runtime.determinism"), {"runtime": {"devices": 2}}, ["runtime"]),  # one still default
    (("runtime.devices",), {"runtime": {"devices": 2}}, ["runtime.devices"]),  # spelled out: the key alone
    (("seed", "train", "trace.min_tokens"), {"seed": 1, "train": {"lr": 1}, "trace": {}}, ["seed", "train", "trace"]),
    (("trace.min_tokens",), {}, ["trace.min_tokens"]),  # not even its section: DVC names it missing
])
def test_dvc_tracks_each_param_as_far_as_params_yaml_spells_it_out(keys, given, expected) -> None:
    from marin.stages.dvcyaml import dvc_params

    assert dvc_params(keys, given) == expected


def test_a_data_dependency_is_the_output_that_holds_it() -> None:
    from marin.stages.dvcyaml import as_outputs

    sft = stages.declaration("sft")
    assert as_outputs(sft.deps, stages.STAGES) == ["models/final", "data/tokens", "data/instructions"]
    assert set(sft.deps) > {"data/tokens/tokenizer.json", "data/tokens/chat_template.jinja"}  # what the ledger records
    assert as_outputs(("elsewhere/x.json", "data/tokensx"), stages.STAGES) == ["elsewhere/x.json", "data/tokensx"]
