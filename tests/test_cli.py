"""The `marin` command as a user meets it: help for every command and argument, --version,
validated choices, progress on stderr for the long steps, no library chatter, one name for
each of the model's two digests."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from importlib.metadata import version

import pytest
import yaml

from marin.cli import build_parser
from tests.conftest import REPO, Project

RST = re.compile(r"``|:func:|:class:|:mod:|\.\. ")


def _marin(*args: str, cwd=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "marin.cli", *args], cwd=cwd or REPO, capture_output=True,
                          text=True, timeout=120)


def _parsers(p: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) of the top parser and every subcommand, depth first."""
    yield path, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _parsers(sub, (*path, name))


def test_every_command_and_argument_has_user_facing_help() -> None:
    seen = []
    for path, p in _parsers(build_parser()):
        seen.append(" ".join(path))
        text = p.format_help()
        assert not RST.search(text), (path, RST.search(text).group(0))
        for a in p._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            if isinstance(a, argparse._SubParsersAction):
                assert all(c.help for c in a._choices_actions), path  # every subcommand is described
                continue
            assert a.help and a.help != argparse.SUPPRESS, (path, a.dest)
    for cmd in ("ledger log", "ledger repair", "diff", "report verify", "verify", "params check", "pin"):
        assert cmd in seen
    top = _marin("--help")
    assert top.returncode == 0 and "The ``marin`` command" not in top.stdout and "dvc repro" in top.stdout
    verify = _marin("verify", "--help").stdout
    assert "exit status:" in verify and "``" not in verify


def test_positionals_are_described() -> None:
    diff = _marin("diff", "--help").stdout
    assert re.search(r"RUN_A\s+a run id", diff) and re.search(r"RUN_B\s+the run id to compare", diff)
    repair = _marin("ledger", "repair", "--help").stdout
    assert re.search(r"RUN_ID\s+the run whose ledger file ends in a torn line", repair)
    assert re.search(r"DIRECTORY\s+the report directory", _marin("report", "verify", "--help").stdout)


def test_report_help_reads_as_an_optional_subcommand() -> None:
    text = _marin("report", "--help").stdout
    usage = text.split("\n\n")[0]
    assert usage.splitlines()[0] == "usage: marin report [--model MODEL]"  # building needs no subcommand
    assert "marin report verify DIRECTORY" in usage and "{verify}" not in usage
    assert "optional subcommand" in text and "Without a subcommand: build" in text


def test_version_is_the_installed_distributions() -> None:
    r = _marin("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"marin {version('marin')}"


def test_an_unknown_stage_is_an_error_listing_the_stages(tmp_path) -> None:
    r = _marin("ledger", "log", "--stage", "trian", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert "invalid choice: 'trian'" in r.stderr
    stages = list(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"])  # read by YAML: names with `_` too
    assert "evaluate_instruct" in stages and "export_instruct" in stages
    assert all(f"'{s}'" in r.stderr for s in stages)  # every stage of dvc.yaml is offered


def test_dvc_plots_output_is_git_ignored(project: Project) -> None:
    (project.root / "dvc_plots").mkdir()
    (project.root / "dvc_plots" / "index.html").write_text("<html></html>")
    assert project.run("git", "check-ignore", "dvc_plots/index.html").returncode == 0
    assert "dvc_plots" not in project.git("status", "--porcelain")


@pytest.mark.slow
def test_long_steps_show_progress_on_stderr_and_libraries_stay_quiet(trained_project: Project) -> None:
    """curate, tokenize and evaluate draw progress on stderr (stdout keeps the results), with MLflow on and
    silent; the model's two digests are named wherever they are shown."""
    proj = trained_project
    proj.env["MARIN_MLFLOW"] = "on"
    proj.env["MARIN_PROGRESS"] = "always"  # the tiny project's steps end before the bars' one-second delay
    for stage, bar, shown in (("curate", "curate", r"\d+ shards"), ("tokenize", "tokenize train", r"\d+/\d+"),
                              ("evaluate", "evaluate", r"\d+/\d+")):
        r = proj.stage(stage)
        assert re.search(rf"{bar}: .*{shown}", r.stderr), (stage, r.stderr[-500:])
        assert bar + ":" not in r.stdout.replace(f"{stage}: ", "")  # bars are not in the results
        for out in (r.stdout, r.stderr):
            assert not re.search(r"\bINFO\b", out), (stage, out)  # no MLflow / alembic INFO lines
    # train's identity in the ledger's views: folder digest, then the tensor digest beside it
    [train] = proj.runs("train")
    model = next(r["body"] for r in train if r["kind"] == "output" and r["body"]["name"] == "model")
    folder, tensors = model["digest"].split(":")[1], model["tensor_digest"].split(":")[1]
    log = proj.marin("ledger", "log", "--stage", "train", check=True).stdout
    assert f"model={folder[:12]} (tensors {tensors[:12]})" in log
    lineage = proj.marin("lineage", "models/final", check=True).stdout.splitlines()[0]
    assert lineage.startswith(f"sha256:{folder[:12]}") and f"(folder digest; tensor digest sha256:{tensors[:12]})" \
        in lineage
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{proj.root / 'mlflow.db'}")
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()],
                               f"tags.`marin.run_id` = '{train[0]['run_id']}'")
    assert run.data.tags["marin.output.model"] == model["digest"]
    assert run.data.tags["marin.output.model.tensor_digest"] == model["tensor_digest"]
    prov = json.loads(proj.marin("lineage", "models/final", "--format", "prov-json", check=True).stdout)
    assert prov["entity"][model["digest"]]["marin:tensor_digest"] == model["tensor_digest"]


def test_citation_cff_describes_this_release() -> None:
    import tomllib

    import yaml

    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    assert {"message", "title", "authors"} <= set(cff) and all(a.get("name") for a in cff["authors"])
    assert cff["version"] == project["version"] and cff["license"] == project["license"]


def _leaf_commands() -> list[tuple[str, ...]]:
    """Every runnable command path (a parser whose subcommand is not required)."""
    leaves = []
    for path, p in _parsers(build_parser()):
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if path and not any(a.required for a in subs):
            leaves.append(path)
    return leaves


OUTSIDE = {  # each command that needs a project, with arguments it would otherwise accept
    ("ledger", "check"): (), ("ledger", "head"): (), ("ledger", "log"): (), ("ledger", "repair"): ("x",),
    ("status",): (), ("mlflow", "sync"): (), ("lineage",): ("models/final",), ("trace",): ("some text",),
    ("diff",): ("a", "b"),
    ("verify",): ("train-x",), ("report",): (), ("report", "verify"): ("reports/x",), ("keygen",): (),
    ("stages",): (), ("params", "check"): (), ("params", "show"): (), ("pin",): ("corpus",), ("publish",): (),
    ("sweep",): (),
    ("reference", "check"): (), ("reference", "write"): ("--why", "x"),
}


def test_outside_a_project_every_command_says_so_in_one_line_and_writes_nothing(tmp_path, monkeypatch,
                                                                               capsys) -> None:
    from marin.cli import main

    assert set(OUTSIDE) | {("schemas", "check"), ("schemas", "pin"), ("launch", "ray")} == set(_leaf_commands())
    monkeypatch.delenv("MARIN_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    assert not any((p / "params.yaml").exists() or (p / "dvc.yaml").exists() for p in (tmp_path, *tmp_path.parents))
    for command, args in OUTSIDE.items():
        code = main([*command, *args])
        out, err = capsys.readouterr()
        assert code == 2 and out == "", command
        assert err.count("\n") == 1 and "not a marin project (no dvc.yaml/params.yaml here or above)" in err, command
    r = _marin("ledger", "log", cwd=tmp_path)  # as a user meets it: the installed command
    assert r.returncode == 2 and r.stdout == "" and r.stderr.startswith("marin: error: ") and r.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # no .marin/, no ledger/
    (tmp_path / "sub").mkdir()
    assert main(["--root", str(tmp_path / "sub"), "ledger", "log"]) == 2
    assert "--root " in capsys.readouterr().err and list((tmp_path / "sub").iterdir()) == []


def test_launch_without_a_command_or_nodes_is_one_line(capsys) -> None:
    """`marin launch ray` refuses before it joins a cluster (tests/test_hosts_ray.py runs it on one)."""
    from marin.cli import main

    for argv, why in ((["launch", "ray"], "no command; give it after --"),
                      (["launch", "ray", "--nodes", "0", "--", "true"], "--nodes 0: give 1 or more"),
                      (["launch", "ray", "--per-node", "0", "--", "true"], "--per-node 0: give 1 to 256"),
                      (["launch", "ray", "--env", "MARIN_NOT_SET_HERE", "--", "true"], "give NAME=VALUE")):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and err.startswith("marin: error: ") and why in err, err


def test_uv_run_does_not_byte_compile_the_environment_each_time() -> None:
    """`uv run` syncs before it runs; with `[tool.uv] compile-bytecode` each sync compiled every installed
    file again (~20,000 files, about a second). Python compiles what it imports, once."""
    import shutil

    uv = shutil.which("uv")
    assert uv, "uv is on PATH wherever the README's test command runs"
    for _ in range(2):
        r = subprocess.run([uv, "run", "--frozen", "--group", "hf", "python", "-c", "pass"], cwd=REPO,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert "Bytecode compiled" not in r.stderr



def test_every_subcommands_usage_names_its_own_command_line() -> None:
    found = dict(_parsers(build_parser()))
    assert len(found) > 20 and ("report", "verify") in found
    for path, sub in found.items():
        first = sub.format_usage().splitlines()[0]
        if path == ("report",):  # its own two-line usage, the subcommand's line second
            assert first == "usage: marin report [--model MODEL]", first
            continue
        assert first.startswith(f"usage: {' '.join(('marin', *path))} "), (path, first)
        assert first.count("marin") == 1, (path, first)
