"""Environment fingerprint: allow-listed variables only; the code state is recorded."""

import subprocess

import pytest

from marin import env


def test_only_allow_listed_variables_are_recorded() -> None:
    environ = {
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "NPROC": "2", "JAX_ENABLE_X64": "0",
        "AWS_SECRET_ACCESS_KEY": "hunter2", "MLFLOW_TRACKING_PASSWORD": "pw", "HOME": "/root",
        "MARIN_API_TOKEN": "t0ken", "GITHUB_TOKEN": "x", "PATH": "/bin",
    }
    rec = env.recorded_env_vars(environ)
    assert rec == {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "NPROC": "2", "JAX_ENABLE_X64": "0"}


def test_fingerprint_fields() -> None:
    fp = env.fingerprint()
    for key in ("python", "platform", "cpu_model", "isa_flags", "usable_cores", "packages", "env_vars"):
        assert key in fp
    assert fp["packages"]["jax"] and fp["packages"]["jaxlib"]
    assert set(fp["usable_cores"]) <= set(range(fp["cpu_count"]))


def test_code_state_sees_commit_and_dirty_diff(tmp_path) -> None:
    def git(*a):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "marin").mkdir()
    (tmp_path / "marin" / "x.py").write_text("A = 1\n")
    git("add", "-A")
    git("commit", "-qm", "c")
    clean = env.code_state(tmp_path)
    assert clean["git_commit"] and len(clean["git_commit"]) == 40 and not clean["dirty"]
    assert clean["diff_digest"] is None
    (tmp_path / "ledger").mkdir()
    (tmp_path / "ledger" / "run.jsonl").write_text("{}\n")  # ledger writes do not dirty the code
    assert env.code_state(tmp_path) == clean
    (tmp_path / "marin" / "x.py").write_text("A = 2\n")
    dirty = env.code_state(tmp_path)
    assert dirty["dirty"] and dirty["diff_digest"].startswith("sha256:")
    assert dirty["code_digest"] != clean["code_digest"] and dirty["git_commit"] == clean["git_commit"]


def _repo(tmp_path):
    def git(*a):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    for rel, text in {"marin/x.py": "A = 1\n", "dvc.yaml": "stages: {}\n", "README.md": "# r\n",
                      "corpus/a.txt": "a\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    git("add", "-A")
    git("commit", "-qm", "c")
    return env.code_state(tmp_path)


def test_stray_files_are_listed_by_name_and_do_not_make_a_run_dirty(tmp_path) -> None:
    clean = _repo(tmp_path)
    (tmp_path / "notes.txt").write_text("my notes\n")
    (tmp_path / "README.md").write_text("# edited\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "scratch.txt").write_text("not code\n")
    state = env.code_state(tmp_path)
    assert not state["dirty"] and state["diff_digest"] is None and "changed" not in state
    assert state["stray"] == ["README.md", "docs/scratch.txt", "notes.txt"] and state["stray_count"] == 3
    assert state["code_digest"] == clean["code_digest"]


@pytest.mark.parametrize("rel", ["marin/scratch.txt", "marin/x.cpython-311-x86_64-linux-gnu.so", "marin/y.pyc",
                                 "pipeline/notes.md", "schemas/extra.yaml"])
def test_any_file_in_a_code_folder_makes_a_run_dirty_even_if_git_ignores_it(tmp_path, rel) -> None:
    # Python imports marin/x.cpython-311-x86_64-linux-gnu.so in place of marin/x.py, and a sourceless
    # marin/y.pyc as module marin.y; .gitignore hides *.pyc from `git status`. __pycache__ does not count.
    _repo(tmp_path)
    (tmp_path / ".gitignore").write_text("__pycache__/\n*.pyc\n*.so\n")
    (tmp_path / "marin" / "__pycache__").mkdir()
    (tmp_path / "marin" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"bytecode Python checks against x.py")
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rel).write_bytes(b"\x7fELF not the committed code")
    (tmp_path / "notes.txt").write_text("my notes\n")
    state = env.code_state(tmp_path)
    assert state["dirty"] and state["changed"] == [rel], state
    assert state["stray"] == [".gitignore", "notes.txt"]


def test_an_edited_tracked_file_in_a_code_folder_makes_a_run_dirty(tmp_path) -> None:
    _repo(tmp_path)
    (tmp_path / "marin" / "NOTICE").write_text("licence notes\n")
    subprocess.run(["git", "add", "marin/NOTICE"], cwd=tmp_path, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "n"], cwd=tmp_path,
                   check=True)
    (tmp_path / "marin" / "NOTICE").write_text("edited\n")
    state = env.code_state(tmp_path)
    assert state["dirty"] and state["changed"] == ["marin/NOTICE"]


@pytest.mark.parametrize("rel", ["marin/x.py", "dvc.yaml", "marin/new_module.py", "corpus/a.txt"])
def test_code_dvc_yaml_and_tracked_inputs_make_a_run_dirty_and_are_named(tmp_path, rel) -> None:
    _repo(tmp_path)
    (tmp_path / rel).write_text("changed\n")
    (tmp_path / "notes.txt").write_text("my notes\n")
    state = env.code_state(tmp_path, inputs=["corpus/a.txt"])
    assert state["dirty"] and state["diff_digest"].startswith("sha256:")
    assert state["changed"] == [rel] and state["stray"] == ["notes.txt"]


def test_an_input_is_relevant_only_to_the_run_that_reads_it(tmp_path) -> None:
    _repo(tmp_path)
    (tmp_path / "corpus" / "a.txt").write_text("changed\n")
    assert not env.code_state(tmp_path)["dirty"]
    assert env.code_state(tmp_path, inputs=["corpus/a.txt"])["dirty"]


def test_data_class_has_no_machine_noise() -> None:
    fp = env.fingerprint()
    cls = env.data_class(fp)
    assert "cpu_model" not in cls and "usable_cores" not in cls
    assert env.class_digest(cls) == env.class_digest(dict(cls))


def test_a_git_versioned_metrics_file_read_as_input_is_recorded_by_digest_not_dirty(tmp_path) -> None:
    # metrics/ is versioned by git (DVC's convention for `cache: false` metrics): evaluate rewrites
    # metrics/eval.json, which the report reads; that is a pipeline output, not a code change.
    _repo(tmp_path)
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "eval.json").write_text('{"bits_per_byte": 2.0}\n')
    subprocess.run(["git", "add", "metrics"], cwd=tmp_path, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "m"], cwd=tmp_path,
                   check=True)
    (tmp_path / "metrics" / "eval.json").write_text('{"bits_per_byte": 1.5}\n')
    state = env.code_state(tmp_path, inputs=["metrics/eval.json", "corpus/a.txt"])
    assert not state["dirty"] and "stray" not in state and "changed" not in state
    (tmp_path / "corpus" / "a.txt").write_text("changed\n")  # a tracked input still counts
    assert env.code_state(tmp_path, inputs=["metrics/eval.json", "corpus/a.txt"])["changed"] == ["corpus/a.txt"]
