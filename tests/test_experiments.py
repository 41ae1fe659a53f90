"""DVC experiments on a marin project, with real DVC in a temporary git repository: metrics and
plots versioned by git, so that `dvc exp show`, `dvc exp diff` and `dvc metrics diff` compare
real numbers, and an applied or branched experiment carries the ledger runs that made it.

One module-scoped project (a copy of the tiny trained one) runs two experiments; the tests
read it and work on copies."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, Project, copy_project

pytestmark = pytest.mark.slow

LRS = (0.001, 0.01)
WARN_ABOVE = 0.25  # the second experiment's train.max_epochs_warning: the tiny run reads ~0.29 epochs


def readme_baseline() -> str:
    """The README's baseline step, the one line after its pipeline command that commits the run."""
    return next(line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("git add dvc.lock"))


def exp_baseline(proj: Project) -> None:
    """The trained project as a user commits it: its params.yaml in the layout DVC writes (as the shipped
    one is), dvc.lock for the stages that ran (they ran directly, so `dvc commit` records what they made),
    then the README's baseline step, as written there."""
    from dvc.utils.hydra import apply_overrides

    apply_overrides(str(proj.root / "params.yaml"), [f"seed={proj.params['seed']}"])  # the same values
    proj.git("commit", "-qam", "params.yaml in DVC's layout")
    proj.dvc("commit", "-f", "-d", "evaluate")
    proj.run("bash", "-c", readme_baseline(), check=True)


@pytest.fixture(scope="module")
def experiments(tmp_path_factory, _trained_project) -> tuple[Project, dict[float, str], dict[float, str]]:
    """The baseline commit and two `dvc exp run -S train.lr=...` experiments; {lr: experiment name},
    {lr: what its `dvc exp run` printed}."""
    proj = copy_project(_trained_project, tmp_path_factory.mktemp("exp") / "proj")
    exp_baseline(proj)
    names, outputs = {}, {}
    for i, lr in enumerate(LRS):
        names[lr] = f"lr-{i}"
        warn = ["-S", f"+train.max_epochs_warning={WARN_ABOVE}"] if i == 1 else []  # + : a key params.yaml lacks
        out = proj.dvc("exp", "run", "-n", names[lr], "-S", f"train.lr={lr}", *warn, "evaluate")
        outputs[lr] = out.stdout + out.stderr
    return proj, names, outputs


def exp_rows(proj: Project) -> dict[str, dict]:
    """`dvc exp show --json` as {name or 'baseline': {"rev", "lr", "bpb"}}."""
    rows = {}
    for base in json.loads(proj.dvc("exp", "show", "--json").stdout):
        if base["rev"] == "workspace":
            continue
        revs = [("baseline", base)] + [(r["name"], r) for e in base.get("experiments") or [] for r in e["revs"]]
        for name, r in revs:
            data = r["data"]
            rows[name] = {"rev": r["rev"], "lr": data["params"]["params.yaml"]["data"]["train"]["lr"],
                          "bpb": data["metrics"]["metrics/eval.json"]["data"]["bits_per_byte"]}
    return rows


def ledger_bpb(proj: Project) -> dict[float, float]:
    """Bits per byte by train.lr, read from the ledger: each evaluate run's eval record, keyed by
    the lr of the train run that made the model it read."""
    lr_by_model = {}
    for run in proj.runs("train"):
        lr = run[0]["body"]["params"]["train"]["lr"]
        for r in run:
            if r["kind"] == "output" and r["body"]["name"] == "model":
                lr_by_model[r["body"]["digest"]] = lr
    out = {}
    for run in proj.runs("evaluate"):
        model = next(r["body"]["digest"] for r in run if r["kind"] == "input" and r["body"]["name"] == "model")
        evals = [r["body"] for r in run if r["kind"] == "eval" and "corpus" not in r["body"]]
        out[lr_by_model[model]] = evals[0]["values"]["bits_per_byte"]["value"]
    return out


def test_exp_show_holds_each_experiment_and_the_baseline_with_numbers(experiments) -> None:
    proj, names, _ = experiments
    rows = exp_rows(proj)
    recorded = ledger_bpb(proj)
    assert set(rows) == {"baseline", *names.values()}
    assert rows["baseline"]["lr"] == 3.0e-3
    for lr, name in names.items():
        assert rows[name]["lr"] == lr
        assert isinstance(rows[name]["bpb"], float) and rows[name]["bpb"] == recorded[lr]
    assert isinstance(rows["baseline"]["bpb"], float) and rows["baseline"]["bpb"] == recorded[3.0e-3]
    assert len({r["bpb"] for r in rows.values()}) == 3  # three trainings, three results


def test_the_readme_baseline_gives_dvc_numbers_to_compare_with(experiments) -> None:
    """After the README's baseline step, `dvc metrics diff` from the baseline commit holds its numbers
    (it once failed to load HEAD's metrics), and `dvc exp run -S train.lr=...` changed one line of params.yaml."""
    proj, names, _ = experiments
    rows = exp_rows(proj)
    base, exp = rows["baseline"], rows[names[LRS[0]]]
    assert proj.git("rev-parse", "HEAD").strip() == base["rev"]
    for f in ("dvc.lock", "metrics/eval.json", "metrics/train_curve.csv"):
        assert proj.git("ls-tree", "--name-only", "HEAD", f).strip() == f
    assert any(proj.git("ls-tree", "-r", "--name-only", "HEAD", "ledger/runs").split())
    # the project's metrics file (the tiny project never ran evaluate_instruct, whose file DVC would miss)
    p = proj.dvc("metrics", "diff", "--json", "--targets", "metrics/eval.json", "--", "HEAD", exp["rev"])
    assert "failed to load" not in p.stderr, p.stderr
    change = json.loads(p.stdout)["metrics/eval.json"]["bits_per_byte"]
    assert change["old"] == base["bpb"] and change["new"] == exp["bpb"] and base["bpb"] != exp["bpb"]
    numstat = proj.git("diff", "--numstat", base["rev"], exp["rev"], "--", "params.yaml").split()
    assert numstat[:2] == ["1", "1"], numstat  # `-S train.lr=...`: one line out, one in
    assert f"lr: {LRS[0]}" in proj.git("show", f"{exp['rev']}:params.yaml")


def test_each_experiment_s_runs_record_its_name_and_baseline(experiments) -> None:
    """`dvc exp show`'s row leads to the ledger: every run `dvc exp run -n NAME` made records NAME and the
    baseline commit (DVC_EXP_NAME, DVC_EXP_BASELINE_REV); the baseline's own runs record none."""
    proj, names, _ = experiments
    base = exp_rows(proj)["baseline"]["rev"]

    def tag(run: list[dict]) -> dict | None:
        return (run[0]["body"].get("execution") or {}).get("dvc_experiment")

    for run in proj.runs("train"):
        lr = run[0]["body"]["params"]["train"]["lr"]
        want = {"name": names[lr], "baseline_rev": base} if lr in names else None
        assert tag(run) == want, (run[0]["run_id"], tag(run), want)
    evaluated = [t for run in proj.runs("evaluate") if (t := tag(run)) is not None]
    assert sorted(t["name"] for t in evaluated) == sorted(names.values())
    assert {t["baseline_rev"] for t in evaluated} == {base}


def test_metrics_diff_and_exp_diff_print_the_numeric_change(experiments) -> None:
    proj, names, _ = experiments
    rows = exp_rows(proj)
    a, b = rows[names[LRS[0]]], rows[names[LRS[1]]]
    diff = json.loads(proj.dvc("metrics", "diff", "--json", a["rev"], b["rev"]).stdout)
    change = diff["metrics/eval.json"]["bits_per_byte"]
    assert change["old"] == a["bpb"] and change["new"] == b["bpb"]
    assert change["diff"] == pytest.approx(b["bpb"] - a["bpb"])
    text = proj.dvc("exp", "diff", names[LRS[0]], names[LRS[1]]).stdout
    assert "bits_per_byte" in text and f"{b['bpb'] - a['bpb']:.5f}" in text
    assert "train.lr" in text


def test_train_states_its_epochs_and_warns_past_the_limit_in_one_line(experiments) -> None:
    proj, _, outputs = experiments
    manifest = json.loads((proj.root / "data/tokens/manifest.json").read_text())
    train = proj.params["train"]
    seen = train["steps"] * train["batch_size"] * proj.params["model"]["seq_len"]
    epochs = seen / manifest["splits"]["train"]["tokens"]
    assert 0.25 < epochs < 1
    for lr in LRS:
        assert f"train: {seen:,} tokens seen = {epochs:.3g} epochs of" in outputs[lr]
    warnings = [x for x in outputs[LRS[1]].splitlines() if "max_epochs_warning" in x]
    assert warnings == [f"marin: warning: train: {epochs:.3g} epochs ({seen:,} tokens seen, "
                        f"{manifest['splits']['train']['tokens']:,} unique) is past train.max_epochs_warning (0.25): "
                        "the model will memorise its training text; lower train.steps or add data"]
    assert "max_epochs_warning" not in outputs[LRS[0]]  # the default, 4 epochs, is not reached


def test_exp_apply_brings_the_runs_that_made_its_outputs(experiments, tmp_path) -> None:
    """From a clean checkout of the baseline (the workspace's own copies of the experiments' run
    files removed), `dvc exp apply` restores the experiment's outputs and its ledger runs, so that
    `ledger check` passes; without the runs, dvc.lock would name a model no run produced."""
    proj = copy_project(experiments[0], tmp_path / "proj")
    name = experiments[1][LRS[0]]
    proj.git("checkout", "-q", "--", ".")
    proj.git("clean", "-qfd", "ledger")
    shutil.rmtree(proj.root / ".marin" / "index", ignore_errors=True)
    assert len(proj.runs("train")) == 1
    applied = proj.dvc("exp", "apply", name, check=False)
    # export and report never ran in this project: DVC says it has no copy of their outputs, only that
    assert applied.returncode == 0 or set(applied.stderr.split()) >= {"models/hf", "reports/marin-tiny"}, applied
    [run] = [r for r in proj.runs("train") if r[0]["body"]["params"]["train"]["lr"] == LRS[0]]
    model = next(r["body"] for r in run if r["kind"] == "output" and r["body"]["name"] == "model")
    lock = proj.root / "dvc.lock"
    assert model["dvc_md5"] in lock.read_text()
    check = proj.marin("ledger", "check", "--require-outputs")
    assert check.returncode == 0, check.stdout + check.stderr


def test_exp_branch_is_a_commit_whose_ledger_checks(experiments, tmp_path) -> None:
    proj = copy_project(experiments[0], tmp_path / "proj")
    name = experiments[1][LRS[1]]
    proj.dvc("exp", "branch", name, "tuned")
    proj.git("checkout", "-q", "--", ".")
    proj.git("clean", "-qfd", "ledger")
    proj.git("checkout", "-q", "tuned")
    proj.dvc("checkout", "evaluate")
    tracked = proj.git("ls-files", "ledger/runs").split()
    assert sum(p.startswith("ledger/runs/train-") for p in tracked) == 3  # baseline and both experiments
    check = proj.marin("ledger", "check")
    assert check.returncode == 0, check.stdout + check.stderr


# -- plots drawn offline -------------------------------------------------------------------

PLOTS_README = ".dvc/plots/README.md"


def screenshot(page: Path, dest: Path) -> Path:
    """Headless Chromium's picture of ``page`` with every host name unresolvable (no network)."""
    from tests.browser import chromium

    subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--host-resolver-rules=MAP * ~NOTFOUND", "--window-size=900,700", "--virtual-time-budget=10000",
                    f"--user-data-dir={dest.parent / 'chromium-profile'}", f"--screenshot={dest}", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    return dest


def curves(png: Path) -> dict[tuple[int, int, int], dict[int, float]]:
    """The lines drawn in a picture, read from its pixels alone: for each strongly coloured colour
    (grey axes, grid and text are not) that covers a run of at least 100 adjacent columns, the mean
    row of its pixels in each column of its longest run (legend swatches stand apart from it)."""
    from PIL import Image

    img = Image.open(png).convert("RGB")
    w, h = img.size
    px = img.load()
    cols: dict[tuple[int, int, int], dict[int, list[int]]] = {}
    for x in range(w):
        for y in range(h):
            c = px[x, y]
            if max(c) - min(c) > 80:
                cols.setdefault(c, {}).setdefault(x, []).append(y)
    out = {}
    for colour, by_x in cols.items():
        runs: list[list[int]] = []
        for x in sorted(by_x):
            if runs and x == runs[-1][-1] + 1:
                runs[-1].append(x)
            else:
                runs.append([x])
        best = max(runs, key=len)
        if len(best) >= 100:
            out[colour] = {x: sum(by_x[x]) / len(by_x[x]) for x in best}
    return out


def falls(curve: dict[int, float]) -> bool:
    """Whether a drawn curve ends lower on the chart than it starts (screen rows grow downwards)."""
    xs = sorted(curve)
    tenth = max(1, len(xs) // 10)
    return sum(curve[x] for x in xs[-tenth:]) / tenth > sum(curve[x] for x in xs[:tenth]) / tenth


def loss_falls(proj: Project, rev: str) -> bool:
    rows = list(csv.DictReader(io.StringIO(proj.git("show", f"{rev}:metrics/train_curve.csv"))))
    return float(rows[-1]["loss"]) < float(rows[0]["loss"])


def test_the_shipped_plot_page_carries_the_pinned_vega_libraries() -> None:
    page = (REPO / ".dvc/plots/offline.html").read_text(encoding="utf-8")
    inline = [hashlib.sha256(code.encode()).hexdigest() for code in re.findall(r"<script>(.*?)</script>", page, re.S)]
    pinned = re.findall(r"\| `([0-9a-f]{64})` \|", (REPO / PLOTS_README).read_text())
    assert len(inline) == 3 and inline == pinned
    assert "http" not in page.split("<script>")[0] and "{plot_divs}" in page and "{scripts}" not in page


def test_plots_diff_draws_both_experiments_loss_curves_offline(experiments, tmp_path) -> None:
    """`dvc plots diff` of the two experiments, rendered by Chromium with no network: two curves of
    two colours are drawn, each falling where its train_curve.csv says the loss fell. DVC's own
    page (CDN scripts) draws nothing here, which shows the screenshot can tell."""
    proj, names, _ = experiments
    revs = [names[lr] for lr in LRS]
    proj.dvc("plots", "diff", "--targets", "loss", "-o", str(tmp_path / "ours"), *revs)
    drawn = curves(screenshot(tmp_path / "ours" / "index.html", tmp_path / "ours.png"))
    assert len(drawn) == 2, drawn.keys()
    rows = exp_rows(proj)
    want = {loss_falls(proj, rows[r]["rev"]) for r in revs}
    assert {falls(c) for c in drawn.values()} == want
    stock = tmp_path / "stock.html"
    stock.write_text("<html><head>{scripts}</head><body>{plot_divs}</body></html>")
    proj.dvc("plots", "diff", "--targets", "loss", "-o", str(tmp_path / "cdn"), "--html-template", str(stock), *revs)
    assert "cdn.jsdelivr.net" in (tmp_path / "cdn" / "index.html").read_text()
    assert curves(screenshot(tmp_path / "cdn" / "index.html", tmp_path / "cdn.png")) == {}
