"""Environment fingerprint: allow-listed variables only; the code state is recorded."""

import subprocess

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


def test_data_class_has_no_machine_noise() -> None:
    fp = env.fingerprint()
    cls = env.data_class(fp)
    assert "cpu_model" not in cls and "usable_cores" not in cls
    assert env.class_digest(cls) == env.class_digest(dict(cls))
