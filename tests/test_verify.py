"""``marin verify``: honest runs verify bit-exact; each forgery is caught and named.

One small project (mini corpus, tiny model, 3 checkpoint intervals) is built once; each
test works on a copy of it. Forgeries that recompute the hash chain and the Merkle root
first show that ``marin ledger check`` passes: only a replay can catch them.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import rfc8785

from marin import hashing
from marin.ledger.merkle import merkle_root
from tests.conftest import BIN, Project

pytestmark = pytest.mark.slow


@pytest.fixture
def trained(trained_project: Project) -> Project:
    return trained_project


def run_file(proj: Project, stage: str) -> Path:
    [path] = [p for p in (proj.root / "ledger" / "runs").glob(f"{stage.replace('_', '-')}-*.jsonl")]  # trace-index-
    return path


def records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def verifications(path: Path) -> list[dict]:
    return [r["body"] for r in records(path) if r["kind"] == "verification"]


def rewrite_chain(path: Path, recs: list[dict]) -> None:
    """What a forger does: recompute every digest, prev link and the Merkle root (independently of marin's
    record code: sha256 over RFC 8785 canonical JSON without the digest)."""
    prev = None
    for r in recs:
        r["prev"] = prev
        if r["kind"] == "run.finished":
            r["body"]["merkle_root"] = "sha256:" + merkle_root(
                [bytes.fromhex(x["digest"].split(":")[1]) for x in recs[: r["seq"]]]).hex()
        content = rfc8785.dumps({k: v for k, v in r.items() if k != "digest"})
        r["digest"] = "sha256:" + hashlib.sha256(content).hexdigest()
        prev = r["digest"]
    path.write_bytes(b"".join(rfc8785.dumps(r) + b"\n" for r in recs))


def verify(proj: Project, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return proj.run(*prefix, str(BIN / "python"), "-m", "marin.cli", "verify", *args)


def run_id(path: Path) -> str:
    return path.name.removesuffix(".jsonl")


# -- honest runs ------------------------------------------------------------------------


def test_every_stage_verifies_bit_exact_with_upstream(trained: Project) -> None:
    p = verify(trained, "--upstream", "metrics/eval.json")
    assert p.returncode == 0, p.stdout + p.stderr
    stages = ("fetch", "curate", "evalsets", "tokenize", "train", "instructions", "decontaminate", "trace_index",
              "evaluate")
    for stage in stages:  # evaluate's whole upstream
        path = run_file(trained, stage)
        recs = records(path)
        [v] = verifications(path)
        assert v["result"] == "bit-exact" and v["exit_code"] == 0 and v["first_divergence"] is None
        finished = next(r for r in recs if r["kind"] == "run.finished")
        assert v["verified"]["finished_digest"] == finished["digest"]
        assert recs[-1]["kind"] == "verification" and recs[-1]["prev"] == finished["digest"]
        # what was compared: every input, output, checkpoint, metric and eval record of the run
        for kind in ("input", "output", "checkpoint", "metric", "eval"):
            assert v["compared"].get(kind, 0) == sum(r["kind"] == kind for r in recs), (stage, kind)
        assert run_id(path) in p.stdout
    assert trained.marin("ledger", "check").returncode == 0
    table = p.stdout[p.stdout.index("first divergence"):]
    assert table.count("bit-exact") == len(stages)


def test_pinned_to_one_core_verifies_bit_exact(trained: Project) -> None:
    path = run_file(trained, "train")
    assert records(path)[0]["body"]["env"]["usable_cores"] == [0, 1]  # recorded on 2 cores
    p = verify(trained, run_id(path), prefix=("taskset", "-c", "0"))
    assert p.returncode == 0, p.stdout + p.stderr
    [v] = verifications(path)
    assert v["verifier"]["env"]["usable_cores"] == [0]  # the replay really ran on one core
    assert v["verifier"]["determinism_class"]["xla_cpu_threads"] == 2  # the recorded thread count, restored


def test_a_forced_xla_flag_is_another_class_exit_3_with_distances(trained: Project) -> None:
    path = run_file(trained, "train")
    p = verify(trained, "--xla-flags=--xla_cpu_multi_thread_eigen=false", run_id(path))
    assert p.returncode == 3, p.stdout + p.stderr
    assert "BIT-EXACT (" not in p.stdout and "NOT BIT-EXACT" in p.stdout
    [v] = verifications(path)
    assert v["result"] == "class-differs" and v["exit_code"] == 3
    assert [d["key"] for d in v["class_differences"]] == ["xla_flags"]
    recorded = records(path)[0]["body"]["determinism_class"]["xla_flags"]  # the profile's own flags
    assert v["class_differences"][0]["verifier"] == sorted([*recorded, "--xla_cpu_multi_thread_eigen=false"])
    metrics = v["distances"]["metrics"]
    assert set(metrics) >= {"loss", "grad_norm", "accuracy"}
    n_metric = sum(r["kind"] == "metric" for r in records(path))
    assert all(m["compared"] == n_metric and m["max_abs"] >= 0 for k, m in metrics.items() if k != "lr")


# -- forgeries --------------------------------------------------------------------------


def _tamper_checkpoint(ckpt_dir: Path) -> str:
    """Add 1.0 to one element of the token embedding in an orbax checkpoint; returns the leaf name."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    state_dir = (ckpt_dir / "state").resolve()
    tree = ocp.StandardCheckpointer().restore(state_dir)
    names = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    name = next(n for n in names if n.startswith("['params']") and "embed" in n)

    def bump(path, x):
        x = np.array(x)
        if jax.tree_util.keystr(path) == name:
            x.flat[0] += 1.0
        return x

    tree = jax.tree_util.tree_map_with_path(bump, tree)
    shutil.rmtree(state_dir)
    with ocp.StandardCheckpointer() as c:
        c.save(state_dir, tree)
    return name


def test_a_checkpoint_tensor_changed_on_disk_is_named(trained: Project) -> None:
    path = run_file(trained, "train")
    ckpt = next(r for r in records(path) if r["kind"] == "checkpoint" and r["body"]["step"] == 8)
    assert trained.marin("ledger", "check").returncode == 0
    _tamper_checkpoint(trained.root / ckpt["body"]["path"])
    check = trained.marin("ledger", "check")  # found without a replay: the files' digest of the record
    assert check.returncode == 1 and f"FAIL {ckpt['body']['path']}: on disk its files hash to" in check.stderr
    assert "checkpoint changed after it was recorded" in check.stderr
    p = verify(trained, run_id(path))
    assert p.returncode == 1, p.stdout + p.stderr
    [v] = verifications(path)
    d = v["first_divergence"]
    assert (d["seq"], d["kind"], d["step"]) == (ckpt["seq"], "checkpoint", 8)
    assert "embed" in d["tensor"] and "params" in d["tensor"] and "changed on disk" in d["what"]


def test_a_checkpoint_tensor_forged_with_its_record_and_chain_is_named(trained: Project) -> None:
    path = run_file(trained, "train")
    recs = records(path)
    ckpt = next(r for r in recs if r["kind"] == "checkpoint" and r["body"]["step"] == 8)
    ckpt_dir = trained.root / Path(ckpt["body"]["path"]).parent
    _tamper_checkpoint(ckpt_dir / "8")
    # The forger re-digests the forged tensors as the record documents it (leaf path, dtype, shape, bytes),
    # here with marin's own tool, and writes that digest into the record.
    out = trained.root / "forged.json"
    trained.run(str(BIN / "python"), "-m", "marin.train.replay", "compare", "--a", str(ckpt_dir), "--b",
                str(ckpt_dir), "--steps", "8", "--out", str(out), check=True)
    ckpt["body"]["digest"] = json.loads(out.read_text())["8"]["a_digest"]
    ckpt["body"]["files_digest"] = hashing.path_digest(ckpt_dir / "8")  # which ledger check reads
    rewrite_chain(path, recs)
    assert trained.marin("ledger", "check").returncode == 0  # the ledger alone cannot tell
    p = verify(trained, run_id(path))
    assert p.returncode == 1, p.stdout + p.stderr
    d = verifications(path)[0]["first_divergence"]
    assert (d["seq"], d["step"]) == (ckpt["seq"], 8) and "embed" in d["tensor"]


def test_a_metric_forged_with_the_chain_recomputed_is_caught_only_by_replay(trained: Project) -> None:
    path = run_file(trained, "train")
    recs = records(path)
    m = next(r for r in recs if r["kind"] == "metric" and r["body"]["step"] == 6)
    better = m["body"]["values"]["loss"]["value"] * 0.9
    m["body"]["values"]["loss"] = {"value": better, "hex": better.hex()}
    rewrite_chain(path, recs)
    assert trained.marin("ledger", "check").returncode == 0
    p = verify(trained, run_id(path))
    assert p.returncode == 1, p.stdout + p.stderr
    d = verifications(path)[0]["first_divergence"]
    assert (d["seq"], d["kind"], d["step"], d["name"]) == (m["seq"], "metric", 6, "loss")
    assert f"seq {m['seq']} metric step 6 loss" in p.stdout


def test_a_swapped_data_shard_cannot_verify_here_and_records_nothing(trained: Project) -> None:
    """The recorded bytes are nowhere (no DVC cache, the project's copy swapped): exit 4 naming the input
    and the differing files, never a mismatch recorded against an honest run."""
    tokens = trained.root / "data" / "tokens"
    a, b = tokens / "train-00000-of-00003.parquet", tokens / "train-00001-of-00003.parquet"
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    path = run_file(trained, "train")
    before = path.read_bytes()
    p = verify(trained, run_id(path))
    assert p.returncode == 4, p.stdout + p.stderr
    [line] = p.stderr.strip().splitlines()
    assert "cannot verify here" in line and "tokens" in line and a.name in line and b.name in line, line
    assert path.read_bytes() == before
    a.write_bytes(data_a)  # the shards put back: the ledger, verify's record absent, is as it was
    b.write_bytes(data_b)
    assert trained.marin("ledger", "check").returncode == 0


@pytest.mark.parametrize("recompute_recipe", [False, True], ids=["recipe-kept", "recipe-recomputed"])
def test_an_edited_param_in_run_started_is_caught(trained: Project, recompute_recipe: bool) -> None:
    from marin.ledger.run import recipe_digest

    path = run_file(trained, "train")
    recs = records(path)
    s = recs[0]["body"]
    s["params"]["train"]["lr"] = 0.001  # the run trained with 0.003
    if recompute_recipe:  # a thorough forger recomputes the recipe digest too
        s["recipe_digest"] = recipe_digest(s["stage"], s["command"], s["params"], s["code"]["closure_digest"],
                                           s["inputs"], s["determinism_class"])
    rewrite_chain(path, recs)
    assert trained.marin("ledger", "check").returncode == 0
    p = verify(trained, run_id(path))
    assert p.returncode == 1, p.stdout + p.stderr
    d = verifications(path)[0]["first_divergence"]
    if recompute_recipe:  # only the replay shows it: the first logged step differs
        first_metric = next(r for r in recs if r["kind"] == "metric")
        assert (d["kind"], d["seq"], d["step"]) == ("metric", first_metric["seq"], 2)
    else:
        assert (d["kind"], d["seq"]) == ("run.started", 0) and "edited" in d["what"]


def test_segments_catch_a_forged_interval_when_it_is_drawn(trained: Project) -> None:
    from marin.verify import draw

    path = run_file(trained, "train")
    recs = records(path)
    m = next(r for r in recs if r["kind"] == "metric" and r["body"]["step"] == 6)  # interval (4, 8]: index 1
    m["body"]["values"]["grad_norm"] = {"value": 0.5, "hex": (0.5).hex()}
    rewrite_chain(path, recs)
    hit = next(s for s in range(100) if draw(s, 3, 1) == [1])
    miss = next(s for s in range(100) if draw(s, 3, 1) != [1])
    p = verify(trained, "--segments", "1", "--seed", str(miss), run_id(path))
    assert p.returncode == 0, p.stdout + p.stderr  # honest about its reach: this draw missed it
    assert "probability 1/3" in p.stdout
    p = verify(trained, "--segments", "1", "--seed", str(hit), run_id(path))
    assert p.returncode == 1, p.stdout + p.stderr
    v_miss, v_hit = verifications(path)
    assert v_miss["segments"]["seed"] == miss and v_hit["segments"]["seed"] == hit
    assert v_hit["segments"]["drawn"] == [[4, 8]] and v_hit["segments"]["n"] == 3
    d = v_hit["first_divergence"]
    assert (d["seq"], d["step"], d["name"]) == (m["seq"], 6, "grad_norm")


def test_segments_name_an_end_checkpoint_changed_on_disk(trained: Project) -> None:
    from marin.verify import draw

    path = run_file(trained, "train")
    ckpt = next(r for r in records(path) if r["kind"] == "checkpoint" and r["body"]["step"] == 8)
    _tamper_checkpoint(trained.root / ckpt["body"]["path"])  # the end of interval (4, 8]: the record is honest
    hit = next(s for s in range(100) if draw(s, 3, 1) == [1])
    p = verify(trained, "--segments", "1", "--seed", str(hit), run_id(path))
    assert p.returncode == 1, p.stdout + p.stderr
    assert "interval (4, 8]: MISMATCH" in p.stdout
    d = verifications(path)[-1]["first_divergence"]
    assert (d["seq"], d["kind"], d["step"]) == (ckpt["seq"], "checkpoint", 8) and "changed on disk" in d["what"]


def test_a_run_with_uncommitted_code_is_refused(trained: Project) -> None:
    (trained.root / "marin" / "data" / "tokenize.py").write_text(
        (trained.root / "marin" / "data" / "tokenize.py").read_text() + "\n# local edit\n")
    trained.stage("tokenize")
    path = sorted((trained.root / "ledger" / "runs").glob("tokenize-*.jsonl"))[-1]
    p = verify(trained, run_id(path))
    assert p.returncode == 4
    assert "uncommitted changes" in p.stderr and run_id(path) in p.stderr
    assert verifications(path) == [] and trained.marin("ledger", "check").returncode == 0


def test_stray_files_do_not_block_verification_and_are_listed(trained: Project) -> None:
    (trained.root / "README.md").write_text("# a project\n")
    trained.git("add", "README.md")
    trained.git("commit", "-qm", "readme")
    (trained.root / "README.md").write_text("# a project, with local notes\n")
    (trained.root / "notes.txt").write_text("what I tried today\n")
    trained.stage("tokenize")
    path = sorted((trained.root / "ledger" / "runs").glob("tokenize-*.jsonl"))[-1]
    code = records(path)[0]["body"]["code"]
    assert code["dirty"] is False and code["stray"] == ["README.md", "notes.txt"]
    p = verify(trained, run_id(path))
    assert p.returncode == 0, p.stdout + p.stderr
    assert verifications(path)[-1]["result"] == "bit-exact"


@pytest.mark.parametrize("rel", ["dvc.yaml", "marin/data/tokenize.py"])
def test_a_run_with_changed_code_or_dvc_yaml_is_refused_naming_the_file(trained: Project, rel: str) -> None:
    (trained.root / rel).write_text((trained.root / rel).read_text() + "\n# local edit\n")
    trained.stage("tokenize")
    path = sorted((trained.root / "ledger" / "runs").glob("tokenize-*.jsonl"))[-1]
    assert records(path)[0]["body"]["code"]["changed"] == [rel]
    p = verify(trained, run_id(path))
    assert p.returncode == 4 and f"uncommitted changes to {rel}" in p.stderr


def test_a_commit_older_than_the_replay_tool_verifies_fully_but_not_by_segments(trained: Project) -> None:
    trained.git("rm", "-q", "marin/train/replay.py")
    trained.git("commit", "-qm", "a commit before segment replay existed")
    shutil.rmtree(trained.root / "models")
    trained.stage("train")
    path = sorted((trained.root / "ledger" / "runs").glob("train-*.jsonl"))[-1]
    trained.git("revert", "--no-edit", "HEAD")  # the verifier's checkout is newer than the recorded run
    p = verify(trained, run_id(path))
    assert p.returncode == 0, p.stdout + p.stderr
    [v] = verifications(path)
    assert v["result"] == "bit-exact" and "verifier's code" in v["verifier"]["tensor_pass"]
    p = verify(trained, "--segments", "1", run_id(path))
    assert p.returncode == 4 and "predates segment replay" in p.stderr


def _edit_decimal_only(recs: list[dict]) -> dict:
    m = next(r for r in recs if r["kind"] == "metric" and r["body"]["step"] == 4)
    m["body"]["values"]["loss"]["value"] = 1.0  # the hex is left alone: readers of the decimal are fooled
    return m


def _edit_tensor_digest(recs: list[dict]) -> dict:
    o = next(r for r in recs if r["kind"] == "output" and r["body"]["name"] == "model")
    o["body"]["tensor_digest"] = "sha256:" + "ab" * 32
    return o


def _edit_seeds(recs: list[dict]) -> dict:
    recs[0]["body"]["seeds"]["root"] = 7
    return recs[0]


@pytest.mark.parametrize("forge", [_edit_decimal_only, _edit_tensor_digest, _edit_seeds],
                         ids=["metric-decimal", "model-tensor-digest", "run.started-seeds"])
def test_any_field_a_report_cites_is_compared(trained: Project, forge) -> None:
    path = run_file(trained, "train")
    recs = records(path)
    edited = forge(recs)
    rewrite_chain(path, recs)
    assert trained.marin("ledger", "check").returncode == 0
    p = verify(trained, run_id(path))
    assert p.returncode == 1, p.stdout + p.stderr
    d = verifications(path)[0]["first_divergence"]
    assert (d["seq"], d["kind"]) == (edited["seq"], edited["kind"])


def test_segments_without_the_checkpoints_on_disk_cannot_verify(trained: Project) -> None:
    shutil.rmtree(trained.root / "checkpoints")
    path = run_file(trained, "train")
    p = verify(trained, "--segments", "1", run_id(path))
    assert p.returncode == 4 and "not on this machine" in p.stderr
    assert verifications(path) == [] and not (trained.root / "checkpoints").exists()


def test_upstream_of_a_changed_file_is_refused(trained: Project) -> None:
    weights = trained.root / "models" / "final" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    p = verify(trained, "--upstream", "models/final")
    assert p.returncode == 4 and "differs from every recorded output" in p.stderr
