"""dcp-mla: CUDA kernels for decode context parallelism (DCP) with multi-head latent attention.

The planner and the capability queries need neither torch nor a GPU:

    import dcp_mla
    print(dcp_mla.plan(context=131072, dcp_size=4, batch=64))

The operations take torch CUDA tensors (torch >= 2.4) and are torch custom ops
(`torch.ops.dcp_mla.*`), so torch.compile and CUDA graphs capture them:

    out, lse = dcp_mla.decode_dense(q, cache, block_table, lens)

`dcp_mla.flash_mla` has FlashMLA's interface over the same kernels. docs/contract.md in the
repository is the contract every operation meets; docs/semantics.md what each computes.

Errors: a bad Python value raises TypeError or ValueError naming the argument; a call the library
refuses raises DcpMlaError (a RuntimeError) with its DcpMlaStatus and message. When the library
refused an argument or a configuration (INVALID_ARGUMENT, INVALID_CONFIG: `plan(dcp_size=3)`,
`batch=0`, `num_q=9`) the error is a DcpMlaValueError, a DcpMlaError that is also a ValueError.
"""

from ._lib import DcpMlaError, DcpMlaValueError, ABI_VERSION
from ._native import version as _native_version
from .planner import (
    KV_FORMATS, Plan, PrefillPlan, a2a_slot_bytes, ag_rs_workspace_bytes, capacity, causal_local_lens,
    check_config, check_decode, check_topk, compute_capability_supported, decode_num_splits, decode_workspace_bytes,
    default_scale, local_len, model1_default_scale, model1_page_bytes, model1_pages, pages_for, plan,
    prefill_piece_table, prefill_plan, token_address, topk_workspace_bytes, variants, version,
)

__version__ = _native_version()

#: The operations (dcp_mla.ops): present when torch is installed.
OPS = (
    "kv_fill", "decode_dense", "decode_sparse", "decode_workspace", "kv_fill_model1", "decode_model1",
    "ag_rs_correct", "ag_rs_finish",
    "a2a_pack", "a2a_combine", "merge_two", "topk_local", "topk_pack", "topk_merge", "topk_compact",
    "prefill_flatten", "prefill_reorder", "local_lens",
)

try:
    import torch as _torch  # noqa: F401
except ImportError:  # the planner alone: the operations say what is missing when asked for
    def __getattr__(name):
        if name in OPS or name in ("ops", "flash_mla"):
            raise ImportError(f"dcp_mla.{name} needs torch (>= 2.4): pip install torch")
        raise AttributeError(f"module 'dcp_mla' has no attribute {name!r}")
else:
    # Imported eagerly (not on first use) so torch.compile sees plain module attributes.
    from . import flash_mla, ops  # noqa: F401
    from .ops import (  # noqa: F401
        a2a_combine, a2a_pack, ag_rs_correct, ag_rs_finish, decode_dense, decode_model1, decode_sparse,
        decode_workspace, kv_fill, kv_fill_model1, local_lens, merge_two, prefill_flatten, prefill_reorder,
        topk_compact, topk_local, topk_merge, topk_pack,
    )
