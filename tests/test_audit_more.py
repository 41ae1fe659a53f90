"""Variants of issue 38's bounded-work fixes found by a second audit: harness limits a task YAML sets
(max_gen_toks; data files outside the project, not regular, or over the ``task`` cap), DVC remote
fetches without a byte cap or an overall deadline, the FMTI indicator list read whole, and a
replay's output captured without bound."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from lm_eval.api.instance import Instance
from tokenizers import Tokenizer, models

from marin import readers
from marin.config import NetworkParams
from marin.errors import StageError
from marin.evaluate import harness_run as hr
from marin.evaluate.harness import UnigramLM, gen_limit
from marin.remote import Remote, RemoteError, _fetch
from marin.report import fmti
from marin.report.facts import ReportError
from marin.verify import workspace

# -- M5: the harness's limits ------------------------------------------------------------------------


def _unigram(seq_len: int = 8) -> UnigramLM:
    tok = Tokenizer(models.WordLevel({"a": 0, "b": 1}, unk_token="a"))
    return UnigramLM(np.array([5, 1]), tok, eos_id=1, seq_len=seq_len)


def _generate(max_gen_toks: object) -> Instance:
    return Instance("generate_until", {}, ("a", {"until": [], "max_gen_toks": max_gen_toks}), 0)


def test_a_task_asking_for_more_tokens_than_seq_len_is_refused_in_one_line() -> None:
    """A YAML's max_gen_toks of a billion built a billion-token list under the unigram baseline: now one line."""
    lm = _unigram()
    assert lm.generate_until([_generate(3)]) == ["a a a"]  # WordLevel decodes with spaces
    t0 = time.monotonic()
    with pytest.raises(StageError) as e:
        lm.generate_until([_generate(10**9)])
    assert time.monotonic() - t0 < 1
    assert str(e.value) == ("max_gen_toks 1000000000 is outside 1 to the model's seq_len 8; set the task YAML's "
                            "generation_kwargs.max_gen_toks to 8 or less")
    for bad in ("many", -1, 0, 2.5, True):
        with pytest.raises(StageError):
            gen_limit({"max_gen_toks": bad}, 64, 8)
    assert gen_limit({}, 8, 8) == 8 and gen_limit({"max_gen_toks": "4"}, 64, 8) == 4


def _task(*files: str) -> dict:
    return {"dataset_path": "json", "dataset_kwargs": {"data_files": {"test": list(files)}}}


def test_task_data_outside_the_project_not_regular_or_over_the_cap_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    (tmp_path / "outside.jsonl").write_text("{}\n")
    (root / "ok.jsonl").write_text("{}\n")
    os.mkfifo(root / "fifo.jsonl")
    with open(root / "huge.jsonl", "wb") as f:  # sparse: no disk, the size over the cap
        f.truncate(readers.CAPS["task"].size + 1)
    assert hr.missing_data(root, "t", _task("ok.jsonl")) is None
    cases = {str(tmp_path / "outside.jsonl"): "lies outside the project",
             "../outside.jsonl": "lies outside the project",
             "fifo.jsonl": "is a fifo",
             "huge.jsonl": f"over the {readers.CAPS['task'].size:,}-byte cap for task data"}
    for f, why in cases.items():
        line = hr.missing_data(root, "t", _task("ok.jsonl", f))
        assert line is not None and line.startswith(f"harness task 't': data file {f} ") and why in line, line
        assert "\n" not in line
    line = hr.missing_data(root, "t", {"dataset_path": str(tmp_path)})
    assert line is not None and "lies outside the project" in line


# -- M6: DVC remote fetches ------------------------------------------------------------------------------


def _remote(base: Path, **bounds: float) -> Remote:
    from dvc_objects.fs.local import LocalFileSystem

    return Remote("lab", str(base), LocalFileSystem(), str(base), None, NetworkParams(**bounds))


def _object(base: Path, digest: str) -> Path:
    hexd = digest.split(":", 1)[1]
    path = base / "marin" / "sha256" / hexd[:2] / hexd[2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


DIGEST = "sha256:" + "ab" * 32


def test_a_remote_object_over_max_bytes_is_refused(tmp_path: Path) -> None:
    base = tmp_path / "remote"
    _object(base, DIGEST).write_bytes(b"x" * 5000)
    with pytest.raises(RemoteError) as e:
        _fetch(_remote(base, max_bytes=1000), DIGEST, tmp_path / "got", "the manifest")
    assert str(e.value).startswith("the manifest: ") and "more than network.max_bytes (1000 bytes)" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_remote_fetch_that_never_ends_stops_at_the_total_deadline(tmp_path: Path) -> None:
    """A fifo in a local remote never opens (as a trickling server never finishes): the fetch gives up at
    network.total_timeout_s, in one line."""
    base = tmp_path / "remote"
    fifo = _object(base, DIGEST)
    os.mkfifo(fifo)
    t0 = time.monotonic()
    try:
        with pytest.raises(RemoteError) as e:
            _fetch(_remote(base, total_timeout_s=1.0), DIGEST, tmp_path / "got", "the manifest")
        assert time.monotonic() - t0 < 5
        assert "not fetched within network.total_timeout_s (1 s)" in str(e.value) and "\n" not in str(e.value)
    finally:  # let the abandoned reader go: a writer opens and closes the fifo, the reader sees its end
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_a_remote_object_within_the_bounds_is_fetched_and_checked(tmp_path: Path) -> None:
    import hashlib

    data = b"weights" * 100
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    base = tmp_path / "remote"
    _object(base, digest).write_bytes(data)
    _fetch(_remote(base), digest, tmp_path / "got", "the manifest")
    assert (tmp_path / "got").read_bytes() == data


# -- L4: reads the walker missed ----------------------------------------------------------------------------


def test_the_fmti_indicator_list_is_read_through_the_bounded_reader(tmp_path: Path) -> None:
    (tmp_path / "ok.csv").write_bytes("\ufeffDomain,Subdomain,Indicator\nModel,Model basics,Model size\n"
                                      .encode())
    assert fmti._indicators(tmp_path / "ok.csv") == [("Model", "Model basics", "Model size")]
    os.mkfifo(tmp_path / "fifo.csv")
    with pytest.raises(ReportError) as e:
        fmti._indicators(tmp_path / "fifo.csv")
    assert "is a fifo" in str(e.value)
    with open(tmp_path / "huge.csv", "wb") as f:
        f.truncate(readers.CAPS["text"].size + 1)
    with pytest.raises(ReportError) as e:
        fmti._indicators(tmp_path / "huge.csv")
    assert "it was not read" in str(e.value)


def test_a_replays_output_is_kept_to_its_last_64_kib(tmp_path: Path) -> None:
    """A replay that prints 20 MB: the message keeps its tail, memory does not hold the rest."""
    code = "import sys; sys.stdout.write('o' * 20_000_000 + 'END'); sys.stderr.write('e' * 20_000_000 + 'TAIL')"
    p = workspace._run_captured([sys.executable, "-c", code], tmp_path, dict(os.environ))
    assert p.returncode == 0
    assert len(p.stdout) == workspace.TAIL and p.stdout.endswith("END")
    assert len(p.stderr) == workspace.TAIL and p.stderr.endswith("TAIL")
