"""GPU tests take the `dev` fixture: they skip cleanly without torch or a CUDA device, and fail
instead when DCP_MLA_REQUIRE_GPU=1 (what the H200 run sets: a skipped GPU test must not read as
a pass)."""

import os

import pytest


def _gpu_reason():
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


@pytest.fixture
def dev():
    reason = _gpu_reason()
    if reason is not None:
        if os.environ.get("DCP_MLA_REQUIRE_GPU") == "1":
            pytest.fail(f"DCP_MLA_REQUIRE_GPU=1 but {reason}")
        pytest.skip(reason)
    import torch
    torch.manual_seed(int(os.environ.get("DCP_MLA_SEED", "0")))
    return torch.device("cuda")
