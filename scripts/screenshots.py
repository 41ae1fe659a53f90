"""The README's two pictures, taken again: the report (``reports/<model>/report.html``) and the MLflow UI of a
project where ``dvc repro`` ran with ``MARIN_MLFLOW=on`` (the README's first command), each rendered by headless
Chromium (``scripts/system-packages.sh`` installs it) and saved as a small palette PNG in ``docs/img/``:

    uv run python scripts/screenshots.py PROJECT [--out docs/img] [--width 1280] [--height 860]

The MLflow UI is ``mlflow server`` on the project's ``mlflow.db`` and ``mlartifacts/`` at 127.0.0.1 (a free
port), stopped afterwards; Chromium waits ``--budget`` ms of virtual time for each page's scripts to draw it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shoot(url: str, out: Path, width: int, height: int, budget: int) -> None:
    """``url`` as headless Chromium draws it in a ``width`` x ``height`` window, into ``out`` (a small PNG)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("screenshots: chromium is not installed; run scripts/system-packages.sh")
    with tempfile.TemporaryDirectory(prefix="marin-shot-") as tmp:
        raw = Path(tmp) / "raw.png"
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={tmp}/profile", f"--window-size={width},{height}",
                        f"--virtual-time-budget={budget}", f"--screenshot={raw}", url],
                       check=True, capture_output=True, timeout=300)
        from PIL import Image

        img = Image.open(raw).convert("RGB")
        img = img.resize((width * 3 // 4, height * 3 // 4), Image.Resampling.LANCZOS)  # 3/4 size: still legible
        img.quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    print(f"screenshots: {out} ({out.stat().st_size:,} bytes) from {url}")


def mlflow_ui(project: Path, out: Path, width: int, height: int, budget: int) -> None:
    """The project's MLflow experiment as its UI lists the runs."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{(project / 'mlflow.db').resolve()}"
    experiments = [e for e in MlflowClient(uri).search_experiments() if e.name != "Default"]
    if not experiments:
        sys.exit(f"screenshots: {project / 'mlflow.db'} has no experiment; run `dvc repro` with MARIN_MLFLOW=on")
    port = _port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
                               "--artifacts-destination", str((project / "mlartifacts").resolve()),
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # no job runner
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300  # its imports take a minute on a loaded 2-core machine
        while True:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    sys.exit(f"screenshots: mlflow server on {uri} did not answer at {base}/health")
                time.sleep(0.5)
        shoot(f"{base}/#/experiments/{experiments[0].experiment_id}/runs", out, width, height, budget)  # the runs table
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("project", type=Path)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs/img")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=860)
    ap.add_argument("--budget", type=int, default=20000, help="ms of virtual time for a page's scripts")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    reports = sorted((a.project / "reports").glob("*/report.html"))
    if not reports:
        sys.exit(f"screenshots: {a.project}/reports/*/report.html: none; run `dvc repro` (its report stage)")
    shoot(reports[0].resolve().as_uri(), a.out / "report.png", a.width, a.height, a.budget)
    mlflow_ui(a.project, a.out / "mlflow.png", a.width, a.height, a.budget)


if __name__ == "__main__":
    main()
