#!/usr/bin/env bash
# The engine as an ARM machine runs it, on an x86 Debian machine: an AArch64 Python 3.11 and torch under qemu-user,
# so platform.machine() is aarch64 and the engine builds and takes the NEON kernels (with the cross compiler,
# which qemu's Python runs natively). About 50-100x slower than native: for checking bits and exactness (SD == AR
# on NEON), never for timings.
#
#   scripts/arm_emulated.sh setup              # once, ~1 min (root: apt): 1.1 GB under $ARM_ROOT (/opt/ssd-chat-arm)
#   scripts/arm_emulated.sh python ARGS...     # python3.11 ARGS under qemu, this repo on its path
#
# e.g. scripts/arm_emulated.sh python -m ssd_chat bench --draft smollm2-135m-draft --modes ar,sd --limit 2 \
#        --max-tokens 24 --threads 1 --no-ignore-eos --json arm.json
# torch is 2.8.0 there, not the project's 2.13.0: PyPI's AArch64 wheels of later torch are CUDA builds, which do
# not load without the CUDA libraries.
set -euo pipefail
ROOT=${ARM_ROOT:-/opt/ssd-chat-arm}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PIP=${PIP:-$REPO/.venv/bin/pip}

setup() {
  dpkg --add-architecture arm64
  apt-get update -q
  apt-get install -y -q g++-aarch64-linux-gnu qemu-user
  mkdir -p "$ROOT/debs" "$ROOT/sysroot" "$ROOT/wheels" "$ROOT/site"
  (cd "$ROOT/debs" && for p in python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libexpat1 zlib1g libffi8 \
      libssl3 libbz2-1.0 liblzma5 libsqlite3-0 libuuid1 libncursesw6 libtinfo6 libreadline8 libdb5.3 libgdbm6 \
      libnsl2 libtirpc3 libcrypt1 libgcc-s1 libstdc++6 libc6 libgomp1; do apt-get download "$p:arm64"; done)
  for d in "$ROOT"/debs/*.deb; do dpkg -x "$d" "$ROOT/sysroot"; done
  # the project's dependencies at this venv's versions, torch excepted
  "$PIP" freeze --exclude-editable | grep -v -e '^torch==' -e '^ruff==' -e '^kernels==' > "$ROOT/requirements.txt"
  echo "torch==2.8.0" >> "$ROOT/requirements.txt"
  "$PIP" download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 \
    --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64 \
    --platform manylinux_2_27_aarch64 -d "$ROOT/wheels" -r "$ROOT/requirements.txt"
  for w in "$ROOT"/wheels/*.whl; do python3 -m zipfile -e "$w" "$ROOT/site/"; done
  echo "ready: scripts/arm_emulated.sh python -c 'import torch, platform; print(torch.__version__, platform.machine())'"
}

case "${1:-}" in
  setup) setup ;;
  python)
    shift
    PYTHONPATH="$ROOT/site:$REPO" HF_HUB_OFFLINE=1 CXX=aarch64-linux-gnu-g++ \
      exec qemu-aarch64 -L "$ROOT/sysroot" "$ROOT/sysroot/usr/bin/python3.11" "$@" ;;
  *) echo "usage: $0 setup | python ARGS..." >&2; exit 2 ;;
esac
