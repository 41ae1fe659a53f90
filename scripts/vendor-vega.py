"""Rebuild .dvc/plots/offline.html: DVC's plot page with Vega, Vega-Lite and vega-embed inline, so
that `dvc plots show` and `dvc plots diff` draw with no network (DVC's own page loads them from a CDN).

    python scripts/vendor-vega.py    # needs npm and the npm registry; run by hand when upgrading

Each package is fetched with `npm pack`, checked against the tarball sha256 pinned below, and its
minified UMD build is copied into the page verbatim; .dvc/plots/README.md lists the sha256 of each
copied file (tests/test_plots_offline.py checks the page against them)."""

from __future__ import annotations

import hashlib
import subprocess
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# package@version: (tarball sha256, file inside the tarball)
PACKAGES = {
    "vega@5.33.1": ("1b8504b6731c5311be3269c4d84ca996a5cc293bc772283293ede20c490e16c3", "package/build/vega.min.js"),
    "vega-lite@5.23.0": ("e4cbfdd8f6f1abe381c59cd558fd6a559c12b1496bfdf2e0c3295263a40fe4da",
                         "package/build/vega-lite.min.js"),
    "vega-embed@6.29.0": ("ecf1ee709c2bac9e0a4ead6908114b05b62c71493e10a8a4308109bb070f8eb1",
                          "package/build/vega-embed.min.js"),
}
# DVC replaces {plot_divs} with one <div> per plot, each calling vegaEmbed; no {scripts}: that is where
# DVC would put its CDN <script> tags.
PAGE = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
{refresh_tag}
<title>DVC Plot (offline: Vega, Vega-Lite, vega-embed inline; .dvc/plots/README.md)</title>
SCRIPTS
<style>table { border-spacing: 15px; }</style>
</head>
<body>
{plot_divs}
</body>
</html>
"""


def script(package: str, code: str) -> str:
    assert "</script" not in code.lower(), f"{package}: its code would end the inline <script>"
    return f"<!-- {package} (BSD-3-Clause, .dvc/plots/LICENSE-vega) -->\n<script>{code}</script>"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        scripts = []
        for package, (sha256, member) in PACKAGES.items():
            name = subprocess.run(["npm", "pack", package, "--silent"], cwd=tmp, check=True, capture_output=True,
                                  text=True).stdout.split()[-1]
            tgz = Path(tmp) / name
            got = hashlib.sha256(tgz.read_bytes()).hexdigest()
            assert got == sha256, f"{package}: tarball sha256 {got}, pinned {sha256}"
            with tarfile.open(tgz) as tf:
                code = tf.extractfile(member).read().decode("utf-8")
            print(f"{package} {member} sha256:{hashlib.sha256(code.encode()).hexdigest()}")
            scripts.append(script(package, code))
    out = ROOT / ".dvc" / "plots" / "offline.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(PAGE.replace("SCRIPTS", "\n".join(scripts)), encoding="utf-8")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
