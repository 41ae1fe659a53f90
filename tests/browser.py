"""Headless Chromium driven through the DevTools protocol over ``--remote-debugging-pipe`` (no
port, no websocket client): open a page, wait until a JavaScript condition holds, read the page
and take a screenshot of what it draws at that moment (tests/test_team.py's UI test)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "CI installs chromium from the Debian packages (.ci/run)"
    return found


class Browser:
    """One headless Chromium with one page; the protocol's messages are JSON, each ended by a NUL:
    Chromium reads them from its fd 3 and writes its own to its fd 4."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 1000):
        to_child, self._out = os.pipe()
        self._in, from_child = os.pipe()

        def fds() -> None:  # in the child, before exec: the two pipe ends at 3 and 4 (dup2: inheritable)
            r, w = os.dup(to_child), os.dup(from_child)
            os.dup2(r, 3)
            os.dup2(w, 4)

        self.proc = subprocess.Popen(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--window-size={width},{height}", f"--user-data-dir={profile}", "--remote-debugging-pipe",
             "--no-first-run", "--no-default-browser-check", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4), preexec_fn=fds)
        os.close(to_child)
        os.close(from_child)
        self._buf, self._id, self.session = b"", 0, None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)

    def call(self, method: str, timeout: float = 60, **params: Any) -> dict:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if self.session is not None and not method.startswith("Target."):
            msg["sessionId"] = self.session
        os.write(self._out, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:  # events (no id) and other answers are skipped
            reply = self._read(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium exited ({self.proc.poll()})")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\0", 1)
        return json.loads(line)

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def js(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression[:80]}: {r['exceptionDetails'].get('exception', {}).get('description')}")
        return r["result"].get("value")

    def wait(self, expression: str, done: Callable[[Any], bool], timeout: float = 120, settle: int = 3) -> Any:
        """The value of ``expression`` once ``done`` has held for it ``settle`` polls in a row with
        the value unchanged (a chart still drawing changes between polls); the last value on timeout."""
        deadline, last, same = time.monotonic() + timeout, None, 0
        while time.monotonic() < deadline:
            value = self.js(expression)
            same = same + 1 if done(value) and value == last else 0
            if same >= settle:
                return value
            last = value
            time.sleep(0.5)
        return last

    def screenshot(self, dest: Path) -> Path:
        dest.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))
        return dest

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.call("Browser.close", timeout=10)
        for fd in (self._in, self._out):
            os.close(fd)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
