#!/usr/bin/env bash
# Installs the pinned CUDA 13.0 compiler from PyPI into the repo-local, git-ignored folder
# .toolchain/cuda. Every package is pinned to one release: mixed releases do not work together,
# and the H200's driver (580) rejects PTX from compilers newer than 13.0.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/.toolchain/cuda"
nvcc="$dest/nvidia/cu13/bin/nvcc"
if [ -x "$nvcc" ] && "$nvcc" --version >/dev/null 2>&1; then
  echo "setup-cuda: nvcc already installed at $nvcc"
  exit 0
fi
# (PIP_ROOT_USER_ACTION: pip's "running as root" warning says nothing useful for a --target install.
# DCP_MLA_PYTHON: the interpreter whose pip installs it; the package's build backend passes its own.
# Otherwise the repository's virtual environment's (scripts/python-venv.sh): a stock Debian or
# Ubuntu python3 may have no pip at all.)
python="${DCP_MLA_PYTHON:-}"
if [ -z "$python" ]; then
  python=$("$root/scripts/python-venv.sh")
fi
PIP_ROOT_USER_ACTION=ignore "$python" -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
  --target "$dest" --upgrade \
  nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
  nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85
"$nvcc" --version | tail -n 2
echo "setup-cuda: nvcc installed at $nvcc"
