"""The Python examples run as the README shows them (CPU parts: no torch or GPU needed)."""

import pathlib
import subprocess
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def test_plan_group_example_runs():
    out = subprocess.run([sys.executable, str(EXAMPLES / "plan_group.py")], check=True, capture_output=True,
                         text=True).stdout
    assert "H = D·H_l = 64 heads; each rank holds 32768 of 131072 tokens" in out, out
    assert "token 5: rank 1, block-table column 0, slot 1" in out, out
    assert "rank 0's per-row lengths: [3, 3, 2, 2]" in out, out
    assert "refused:" in out and "D = 3" in out, out
