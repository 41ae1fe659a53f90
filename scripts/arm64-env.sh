#!/usr/bin/env bash
# An arm64 (aarch64) Python environment that runs under qemu-aarch64 (Debian qemu-user), for the tests that
# check the portable profile's bits on another architecture (tests/test_aarch64.py). Built from:
#   - Debian bookworm's arm64 python3.11 and the libraries it links, downloaded with apt-get into a private apt
#     state (this machine's dpkg and sources are not touched) and unpacked into a sysroot (no maintainer script
#     runs: nothing arm64 executes while building);
#   - PyPI's manylinux aarch64 wheels of the packages the train, sft, evaluate and verify paths import, at the
#     versions this project's .venv has (uv.lock's), installed with pip's --platform/--target (no build).
# Everything lands under the cache folder ($MARIN_ARM64_CACHE, default ~/.cache/marin-arm64); a rerun with the
# same package versions finds it built and returns at once. Prints the interpreter to use:
#   <cache>/env-<key>/bin/python   a wrapper that runs qemu-aarch64 on the arm64 python (argv[0] is the wrapper,
#                                  so sys.executable spawns children under the emulator too)
# Usage: scripts/arm64-env.sh [path/to/host/python]   (default: .venv/bin/python of this checkout)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
host_python="${1:-$repo/.venv/bin/python}"
cache="${MARIN_ARM64_CACHE:-$HOME/.cache/marin-arm64}"
qemu="$(command -v qemu-aarch64 || true)"
[ -n "$qemu" ] || { echo "arm64-env: qemu-aarch64 is missing: run scripts/system-packages.sh (Debian qemu-user)" >&2; exit 2; }

# The distributions the stages and `marin verify` import (measured: every module loaded by fetch .. evaluate,
# sft and verify of a tiny run, mapped to its distribution). Pure-Python ones are the same wheel on both.
DISTS="absl-py anyio atpublic attrs certifi chardet charset-normalizer cloudpickle colorama configobj datasets
datasketch diskcache dill dpath dulwich dvc dvc-data dvc-http dvc-objects dvc-render etils filelock flatten-dict flax
flufl.lock fsspec funcy h11 humanize idna jax jaxlib jinja2 jsonpointer jsonschema jsonschema-specifications
jsonschema-rs lm-eval lxml markupsafe ml-dtypes msgpack multiprocess numpy opt-einsum optax orbax-checkpoint orjson
packaging pandas pathspec platformdirs portalocker protobuf psutil pyarrow pygments pygtrie python-dateutil pytz
pyyaml referencing requests rfc3339-validator rfc8785 rich rpds-py sacrebleu safetensors scipy scmrepo setuptools
simplejson six sqltrie tabulate tensorstore tokenizers tqdm treescope typing-extensions urllib3 voluptuous wcwidth
xxhash zc.lockfile zstandard huggingface-hub httpx httpcore httpx2 httpcore2 click truststore"
DEBS="python3.11 libstdc++6 libgomp1"

# name==version for each distribution installed in the host environment (absent ones are skipped)
pins="$("$host_python" - $DISTS <<'EOF'
import sys
from importlib import metadata
for name in sys.argv[1:]:
    try:
        print(f"{name}=={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        pass
EOF
)"
key="$(printf '%s\n%s\n' "$DEBS" "$pins" | sha256sum | cut -c1-16)"
env="$cache/env-$key"
if [ -e "$env/.built" ]; then
  echo "$env/bin/python"; exit 0
fi
start=$SECONDS
rm -rf "$env.tmp" && mkdir -p "$env.tmp/bin" "$cache/apt/state/lists/partial" "$cache/apt/archives/partial"
apt="$cache/apt"
cat > "$apt/sources.list" <<EOF
deb [arch=arm64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb [arch=arm64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-updates main
deb [arch=arm64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main
EOF
: > "$apt/state/status"  # an empty dpkg database: apt resolves the whole closure for arm64
opts=(-q -o Dir::State="$apt/state" -o Dir::State::status="$apt/state/status" -o Dir::Cache::archives="$apt/archives"
      -o Dir::Cache="$apt" -o Dir::Etc::SourceList="$apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent
      -o APT::Architecture=arm64 -o APT::Architectures::=arm64 -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
apt-get "${opts[@]}" update >&2
# shellcheck disable=SC2086
apt-get "${opts[@]}" install -y --download-only --no-install-recommends $DEBS >&2
for deb in "$apt"/archives/*.deb; do dpkg-deb -x "$deb" "$env.tmp/root"; done

# the wheels, pinned by version; pip downloads each file once into its cache
echo "$pins" > "$env.tmp/requirements.txt"
"$host_python" -m pip --disable-pip-version-check -q install --no-deps --only-binary=:all: \
  --platform manylinux2014_aarch64 --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 \
  --platform manylinux_2_27_aarch64 --platform manylinux_2_26_aarch64 --platform linux_aarch64 \
  --implementation cp --python-version 3.11 --abi cp311 --abi abi3 --abi none \
  --cache-dir "$cache/pip" --target "$env.tmp/site" -r "$env.tmp/requirements.txt" >&2

# the interpreter: qemu-aarch64 with the sysroot as its library prefix, argv[0] the wrapper itself
cat > "$env.tmp/bin/python" <<EOF
#!/bin/sh
# arm64 python under qemu-aarch64 (scripts/arm64-env.sh); the site folder holds the aarch64 wheels
here="$env"
PYTHONPATH="\$here/site\${PYTHONPATH:+:\$PYTHONPATH}" exec "$qemu" \${MARIN_QEMU_CPU:+-cpu "\$MARIN_QEMU_CPU"} \\
  -L "\$here/root" -0 "\$here/bin/python" "\$here/root/usr/bin/python3.11" "\$@"
EOF
chmod +x "$env.tmp/bin/python"
rm -rf "$env" && mv "$env.tmp" "$env"
"$env/bin/python" -c "import platform, jax, numpy; assert platform.machine() == 'aarch64', platform.machine()" >&2
touch "$env/.built"
echo "arm64-env: built $env in $((SECONDS - start)) s" >&2
echo "$env/bin/python"
