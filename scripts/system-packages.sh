#!/usr/bin/env bash
# The Debian packages the test suite drives for real, installed when missing (root, or sudo):
#   chromium    renders report.html headless (tests/browser.py)
#   postgresql  a throwaway cluster behind `mlflow server` (tests/servers.py; initdb/pg_ctl)
#   qemu-user   qemu-x86_64 emulates other CPUs for the portable-bits tests (tests/test_portable.py), qemu-aarch64
#               runs the arm64 python of scripts/arm64-env.sh (tests/test_aarch64.py)
#   faketime    a host whose clock is an hour ahead (tests/test_hosts_train.py)
#   iproute2    network namespaces as hosts (tests/hosts.py)
#   libjemalloc2  the allocator a training stage restarts itself with (marin/allocator.py); without it
#               the stage runs on glibc malloc with huge pages, slower (docs/performance.md)
# Python packages come from uv.lock (`uv sync --frozen`), never from here.
set -euo pipefail
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
{ ls /usr/lib/postgresql/*/bin/initdb || command -v initdb; } >/dev/null 2>&1 || missing+=(postgresql)
command -v qemu-x86_64 >/dev/null 2>&1 || missing+=(qemu-user)
command -v faketime >/dev/null 2>&1 || missing+=(faketime)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
ldconfig -p | grep "libjemalloc\.so" >/dev/null || missing+=(libjemalloc2)
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
echo "installing Debian packages: ${missing[*]}" >&2
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
