"""Bounded downloads (issue 38, defects 3 and 4): a ``url`` source is an http(s) address only
(``file:///dev/zero`` wrote 19.6 GiB in 20 s), and a download has a total deadline over all its
tries and a byte cap (a server sending a byte a second was still read at 150 s). Each command runs
as a measured child process (tests/proc.py, through test_bounded's helpers) against real sockets
on 127.0.0.1: one line, its exit code, under 10 s and 500 MB, the ledger kept."""

from __future__ import annotations

import time

import pytest

from marin.config import NetworkParams
from tests.conftest import Project
from tests.servers import Http, Silent, trickle, zeros
from tests.test_bounded import ledger_kept, refused, run

FAST = {"connect_timeout_s": 1, "read_timeout_s": 3, "retries": 2, "total_timeout_s": 3, "max_bytes": 1 << 20}


def _network(proj: Project, **bounds: float) -> None:
    params = proj.params
    params["network"] = {**FAST, **bounds}
    proj.write_params(params)


def _pin(proj: Project, *args: str):
    return run(proj, "-m", "marin.cli", "--root", str(proj.root), "pin", *args)


def _url_source(proj: Project, url: str) -> None:
    params = proj.params
    params["fetch"]["sources"][0].update(kind="url", locator=url, sha256="1" * 64)  # nothing cached matches
    proj.write_params(params)


# -- 3. file: and other non-http addresses -------------------------------------------------------

@pytest.mark.parametrize("args", [("file:///dev/zero",), ("file:///dev/zero", "--kind", "url")])
def test_pin_refuses_a_file_address_in_one_line(project: Project, args: tuple[str, ...]) -> None:
    project.stage("fetch")
    before = project.ledger_files()
    refused(_pin(project, *args), 1, "file:///dev/zero: a file: address is local data; use kind local")
    assert not (project.root / "data/raw/zero").exists()
    ledger_kept(project, before)


@pytest.mark.parametrize("url, words", [("ftp://127.0.0.1/corpus.tar.gz", "ftp scheme"),
                                        ("data:,hello", "data scheme")])
def test_pin_refuses_other_schemes_as_url_sources(project: Project, url: str, words: str) -> None:
    refused(_pin(project, url, "--kind", "url"), 1, f"{url}: {words}; a url source is an http:// or https://")


def test_a_file_url_source_is_refused_by_fetch_and_params_check(project: Project) -> None:
    project.stage("fetch")
    before = project.ledger_files()
    raw = project.tree("data/raw")
    _url_source(project, "file:///dev/zero")
    for argv in (("-m", "pipeline.fetch"), ("-m", "marin.cli", "params", "check")):
        refused(run(project, *argv), 2, "fetch.sources[0].locator: \"file:///dev/zero\" is not allowed",
                "use kind local for a directory, kind file for one file")
    assert project.tree("data/raw") == raw
    ledger_kept(project, before)


# -- 4. a total deadline and a byte cap ----------------------------------------------------------

def test_pin_of_a_trickling_server_ends_at_the_total_deadline(project: Project) -> None:
    _network(project)  # each read is answered within the 3 s read timeout: only the deadline ends it
    with Http(trickle) as server:
        url = f"{server.url}/corpus.tar.gz"
        refused(_pin(project, url), 1, f"{url}: not finished within network.total_timeout_s (3 s, every try")
        assert server.served == 1  # the deadline covers the tries: none was started past it


def test_fetch_of_a_trickling_server_fails_its_run_at_the_deadline(project: Project) -> None:
    project.stage("fetch")
    _network(project)
    before = project.ledger_files()
    raw = project.tree("data/raw")
    with Http(trickle) as server:
        url = f"{server.url}/mini.tar.gz"
        _url_source(project, url)
        refused(run(project, "-m", "pipeline.fetch"), 1, "fetch.sources[mini]: cannot download",
                "network.total_timeout_s (3 s")
    assert project.runs("fetch")[-1][-1]["body"]["status"] == "failed"
    assert project.tree("data/raw") == raw
    ledger_kept(project, before)


def test_retries_on_a_silent_server_stop_at_the_total_deadline(project: Project) -> None:
    _network(project, read_timeout_s=2, retries=10, total_timeout_s=5)  # 11 tries of 2 s would take 30 s
    with Silent() as server:
        url = f"{server.url}/corpus.tar.gz"
        t0 = time.monotonic()
        refused(_pin(project, url), 1, f"{url}: not finished within network.total_timeout_s (5 s")
        assert time.monotonic() - t0 < 8 and 1 <= len(server.held) <= 3


def test_endless_zeros_stop_at_the_byte_cap(project: Project) -> None:
    project.stage("fetch")
    _network(project, total_timeout_s=60)
    before = project.ledger_files()
    with Http(zeros) as server:
        url = f"{server.url}/mini.bin"
        refused(_pin(project, url), 1, f"{url}: the server sent more than network.max_bytes (1048576 bytes)")
        _url_source(project, url)
        refused(run(project, "-m", "pipeline.fetch"), 1, "fetch.sources[mini]: cannot download",
                "more than network.max_bytes")
    assert not list((project.root / "data/raw").rglob("mini.bin"))
    ledger_kept(project, before)


def test_the_default_bounds_give_up_on_a_silent_server_within_a_minute_and_a_half() -> None:
    t = NetworkParams()  # the audit: 3 tries of 60 s and the backoff, 182 s
    silent = (1 + t.retries) * t.read_timeout_s + sum(min(0.5 * 2**i, 5.0) for i in range(t.retries))
    assert silent <= 90 and t.total_timeout_s <= 600 and t.max_bytes <= 16 << 30
