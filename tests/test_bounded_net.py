"""Bounded downloads (issue 38, defects 3 and 4): a ``url`` source is an http(s) address only
(``file:///dev/zero`` wrote 19.6 GiB in 20 s), and a download has a total deadline over all its
tries and a byte cap (a server sending a byte a second was still read at 150 s). Issue 55, defect
7: that deadline is 600 s by default, so a try also ends under a rate floor (10 KiB/s over 30 s by
default) on every download path: urllib, pip and a DVC remote. Each command runs as a measured
child process (tests/proc.py, through test_bounded's helpers) against real sockets on 127.0.0.1:
one line, its exit code, under 10 s and 500 MB, the ledger kept."""

from __future__ import annotations

import hashlib
import random
import re
import time
from pathlib import Path

import pytest

from marin.config import NetworkParams
from tests.conftest import Project
from tests.servers import Http, Silent, drip, page, trickle, zeros
from tests.test_bounded import bounded, ledger_kept, refused, run
from tests.test_sources import _toy_sdist

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


# -- issue 55, 7: a rate floor ends a trickle in a window, not at the total deadline ---------------

FLOOR = {"total_timeout_s": 60, "min_rate_bytes_s": 1000, "min_rate_window_s": 2}
SLOW = "bytes/s over the last 2 s, under network.min_rate_bytes_s (1000 bytes/s); check the server, or lower " \
       "network.min_rate_bytes_s in params.yaml"
BODY = random.Random(55).randbytes(24_000)  # 300 bytes every 0.05 s: 6 KB/s for 4 s, twice the window, 6x the floor


def _ended_by_the_floor(child, *words: str) -> None:
    line = refused(child, 1, *words, SLOW)
    assert re.search(r": \d bytes/s over", line), line  # a byte a second, not the 1000 asked
    assert child.wall_s < FLOOR["total_timeout_s"] / 2, child.wall_s  # the window, far from the deadline


@pytest.mark.parametrize("answer", [trickle, drip(bytes(100), 1, 1.0)], ids=["unknown-size", "known-size"])
def test_pin_of_a_dripping_server_ends_at_the_rate_floor(project: Project, answer) -> None:
    _network(project, **FLOOR)
    with Http(answer) as server:
        url = f"{server.url}/corpus.tar.gz"
        _ended_by_the_floor(_pin(project, url), f"{url}: ")
        assert server.served == 1  # no other try: it would be as slow


def test_fetch_of_a_dripping_server_fails_its_run_at_the_rate_floor(project: Project) -> None:
    project.stage("fetch")
    _network(project, **FLOOR)
    before = project.ledger_files()
    raw = project.tree("data/raw")
    with Http(trickle) as server:
        url = f"{server.url}/mini.tar.gz"
        _url_source(project, url)
        _ended_by_the_floor(run(project, "-m", "pipeline.fetch"), f"fetch.sources[mini]: cannot download {url}: ")
    assert project.runs("fetch")[-1][-1]["body"]["status"] == "failed"
    assert project.tree("data/raw") == raw
    ledger_kept(project, before)


def test_a_slow_download_above_the_floor_completes(project: Project) -> None:
    _network(project, **FLOOR)
    with Http(drip(BODY, 300, 0.05, length=False)) as server:
        child = _pin(project, f"{server.url}/corpus.bin")
    bounded(child)
    assert child.code == 0 and hashlib.sha256(BODY).hexdigest() in child.stdout, child.stderr[-2000:]
    assert child.wall_s > FLOOR["min_rate_window_s"]  # the floor was looked at over whole windows, and held


def _pip_links(proj: Project, tarball: str) -> Http:
    """A find-links page on 127.0.0.1 naming ``tarball`` (no index): pip reads it, then downloads the sdist."""
    links = Http(page(f'<a href="{tarball}">toycorpus-0.1.tar.gz</a>'))
    proj.env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=f"{links.url}/", PIP_NO_CACHE_DIR="1")
    return links


def test_pip_download_of_a_dripping_server_ends_at_the_rate_floor(project: Project) -> None:
    _network(project, **FLOOR)
    with Http(trickle) as server, _pip_links(project, f"{server.url}/toycorpus-0.1.tar.gz"):
        _ended_by_the_floor(_pin(project, "pypi:toycorpus==0.1"),
                            f"pip download of toycorpus==0.1 from {server.url}/toycorpus-0.1.tar.gz: ")


def test_pip_download_above_the_floor_completes(project: Project, tmp_path: Path) -> None:
    sdist = _toy_sdist(tmp_path / "links").read_bytes()
    _network(project, **{**FLOOR, "min_rate_bytes_s": 100, "min_rate_window_s": 0.5})  # a small sdist: 1 s at 1 KB/s
    with Http(drip(sdist, 50, 0.05)) as server, _pip_links(project, f"{server.url}/toycorpus-0.1.tar.gz"):
        child = _pin(project, "pypi:toycorpus==0.1")
    assert child.code == 0 and hashlib.sha256(sdist).hexdigest() in child.stdout, child.stderr[-2000:]


def _http_remote(server: Http, **bounds: float):
    """A DVC http remote on ``server``: DVC's own file system, as ``marin verify`` opens one."""
    from dvc_http import HTTPFileSystem

    from marin.remote import Remote

    return Remote("lab", server.url, HTTPFileSystem(), server.url, None, NetworkParams(**{**FLOOR, **bounds}))


@pytest.mark.parametrize("answer", [trickle, drip(bytes(100), 1, 1.0)], ids=["unknown-size", "known-size"])
def test_a_remote_fetch_from_a_dripping_server_ends_at_the_rate_floor(tmp_path: Path, answer) -> None:
    from marin.remote import RemoteError, _get_within

    with Http(answer) as server:
        t0 = time.monotonic()
        with pytest.raises(RemoteError) as e:
            _get_within(_http_remote(server), f"{server.url}/object", tmp_path / "got", "the manifest")
        took = time.monotonic() - t0
    print(f"measured: {took:.2f} s; {e.value}")
    assert str(e.value).startswith(f"the manifest: {server.url}/object: ") and SLOW in str(e.value)
    assert "\n" not in str(e.value) and took < FLOOR["total_timeout_s"] / 2


def test_a_slow_remote_fetch_above_the_floor_completes(tmp_path: Path) -> None:
    from marin.remote import _get_within

    with Http(drip(BODY, 300, 0.05)) as server:
        t0 = time.monotonic()
        _get_within(_http_remote(server), f"{server.url}/object", tmp_path / "got", "the manifest")
        assert time.monotonic() - t0 > FLOOR["min_rate_window_s"]
    assert (tmp_path / "got").read_bytes() == BODY


def test_an_s3_remote_object_is_fetched_by_s3fs_own_copy_within_the_bounds(tmp_path: Path) -> None:
    """The copy s3fs counts piece by piece (its 50 MiB block reads would hide a rate): whole, or refused
    at its declared size past max_bytes."""
    from dvc_s3 import S3FileSystem

    from marin.remote import Remote, RemoteError, _get_within
    from tests.servers import S3

    s3 = S3().start()
    try:
        s3.put(s3.bucket("lab"), "dvc/object", BODY)
        for bounds, got in (({}, BODY), ({"max_bytes": 1000}, None)):
            remote = Remote("lab", "s3://lab/dvc", S3FileSystem(endpointurl=s3.url), "lab/dvc", None,
                            NetworkParams(**bounds))  # the default 30 s window: moto's first answer takes seconds
            if got is None:
                with pytest.raises(RemoteError, match=re.escape("the manifest: s3://lab/dvc/object is more than "
                                                                "network.max_bytes (1000 bytes)")):
                    _get_within(remote, "lab/dvc/object", tmp_path / "refused", "the manifest")
            else:
                _get_within(remote, "lab/dvc/object", tmp_path / "got", "the manifest")
                assert (tmp_path / "got").read_bytes() == got
    finally:
        s3.stop()
