#!/usr/bin/env bash
# The Python package's tests: installs it with pip into the repository's virtual environment
# (.venv/, made by scripts/python-venv.sh: a stock Debian or Ubuntu Python refuses a system-wide
# `pip install`) and runs python/tests there. The wheel build compiles and embeds the kernels as
# the Rust build does, reusing the kernel cache. Without torch and a GPU the GPU tests report as
# skipped; DCP_MLA_REQUIRE_GPU=1 fails them instead.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
py=$("$root/scripts/python-venv.sh")
"$py" -m pip install --quiet "$root"
"$py" -c "import pytest" 2>/dev/null || "$py" -m pip install --quiet pytest
# From the repo root: python/tests is on sys.path, python/ is not, so the installed package is tested.
cd "$root"
"$py" -m pytest -q -rs python/tests
