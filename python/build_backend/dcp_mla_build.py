"""PEP 517 build backend of the dcp_mla package: maturin, after making sure nvcc is there.

The wheel embeds the kernels' fatbins, which the Rust build compiles with the pinned nvcc 13.0.
A fresh clone has none, so building a wheel first runs scripts/setup-cuda.sh (which installs it
from PyPI into .toolchain/, and returns at once when it is there), unless DCP_MLA_NVCC names a
compiler. Building an sdist needs no compiler.
"""

import os
import subprocess
import sys
from pathlib import Path

import maturin
from maturin import *  # noqa: F401,F403 (every hook maturin provides, overridden below where needed)

_ROOT = Path(__file__).resolve().parents[2]


def _ensure_nvcc():
    if os.environ.get("DCP_MLA_NVCC"):
        return
    env = dict(os.environ, DCP_MLA_PYTHON=sys.executable)
    subprocess.run(["bash", str(_ROOT / "scripts" / "setup-cuda.sh")], check=True, env=env,
                   stdout=sys.stderr)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _ensure_nvcc()
    return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _ensure_nvcc()
    return maturin.build_editable(wheel_directory, config_settings, metadata_directory)
