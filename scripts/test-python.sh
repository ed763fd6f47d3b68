#!/usr/bin/env bash
# The Python package's tests: installs it with `pip install .` (the wheel build compiles and
# embeds the kernels as the Rust build does, reusing the kernel cache) and runs python/tests.
# Without torch and a GPU the GPU tests report as skipped; DCP_MLA_REQUIRE_GPU=1 fails them instead.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
python3 -m pip install --quiet "$root"
python3 -c "import pytest" 2>/dev/null || python3 -m pip install --quiet pytest
# From the repo root: python/tests is on sys.path, python/ is not, so the installed package is tested.
cd "$root"
python3 -m pytest -q -rs python/tests
