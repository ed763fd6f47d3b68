"""The planner (docs/contract.md §1-§2, §7): ownership, local lengths, pages, capacity and
workspace sizes. Plain Python values in and out; no torch, no GPU.
"""

import dataclasses
from ctypes import c_int32, c_size_t, c_uint32, c_uint64
from typing import Dict, List, Optional, Sequence

from . import _lib
from ._lib import KV_BF16, KV_FP8_656

#: KV-cache formats by name (the C ABI's DCP_MLA_KV_* codes) and their bytes per token.
KV_FORMATS = {"bf16": KV_BF16, "fp8_656": KV_FP8_656}
TOKEN_BYTES = {"bf16": 576 * 2, "fp8_656": 656}
#: The H200's SMs: the default for split-KV planning without a device.
H200_SMS = 132


_U64 = (1 << 64) - 1
_I32 = (1 << 31) - 1


def _ints(**named):
    """Every integer argument of a planner function, checked by name (`_lib.integer`): ≥ 0 and
    within 64 bits; ints, not floats or bools."""
    return [_lib.integer(name, v, 0, _U64) for name, v in named.items()]


def kv_format_code(kv_format):
    """'bf16' or 'fp8_656' (or the C ABI code) as the C ABI code."""
    if kv_format in KV_FORMATS.values():
        return kv_format
    try:
        return KV_FORMATS[str(kv_format).lower()]
    except KeyError:
        raise ValueError(f"kv_format: {kv_format!r} is none of {sorted(KV_FORMATS)}") from None


def version() -> str:
    return _lib.lib().dcp_mla_version().decode()


def variants() -> List[str]:
    """Entry points of every compiled kernel variant."""
    l = _lib.lib()
    return [l.dcp_mla_variant_name(i).decode() for i in range(l.dcp_mla_variant_count())]


def default_scale() -> float:
    """The softmax scale of docs/contract.md §4 (576^-1/2)."""
    return _lib.lib().dcp_mla_default_scale()


#: MODEL1's page-wise FP8 cache (docs/contract.md §3, "MODEL1"): bytes a token takes in its
#: page (a 576-byte value row, 448 e4m3 and 64 bf16, and an 8-byte scale slot), and the multiple
#: of bytes a page is padded to.
MODEL1_TOKEN_BYTES, MODEL1_PAGE_ALIGN = 584, 576


def model1_default_scale() -> float:
    """The softmax scale of the MODEL1 decode (FlashMLA's d_qk^-1/2 at d_qk = 512): 512^-1/2."""
    return 512 ** -0.5


def model1_page_bytes(block_size: int) -> int:
    """Bytes of one MODEL1 page of `block_size` tokens: 584·B rounded up to a multiple of 576
    (FlashMLA allocates its MODEL1 cache as [num_blocks, model1_page_bytes(B)] bytes and views it
    [num_blocks, B, 1, 584])."""
    (b,) = _ints(block_size=block_size)
    return -(-b * MODEL1_TOKEN_BYTES // MODEL1_PAGE_ALIGN) * MODEL1_PAGE_ALIGN


def model1_pages(shape: Sequence[int], strides: Sequence[int], name: str = "cache"):
    """(num_pages, block_size, page_stride in bytes) of a MODEL1 cache of 1-byte elements with
    this shape and these strides (in bytes): FlashMLA's [num_blocks, B, 1, 584] or [num_blocks,
    B, 584], each page's B·584 bytes contiguous, pages a multiple of 576 bytes (at least
    model1_page_bytes(B)) apart. A one-page cache takes model1_page_bytes(B). ValueError naming
    `name` otherwise."""
    shape, strides = tuple(shape), tuple(strides)
    if len(shape) == 4:
        if shape[2] != 1:
            raise ValueError(f"{name}: shape {shape}: a 4-d cache has one KV head (dim 2 of size 1)")
        shape, strides = shape[:2] + shape[3:], strides[:2] + strides[3:]
    elif len(shape) != 3:
        raise ValueError(f"{name}: {len(shape)}-d {shape}, expected FlashMLA's MODEL1 [num_blocks, block_size, 1, 584] "
                         f"(or [num_blocks, block_size, 584])")
    pages, bs, row = shape
    if row != MODEL1_TOKEN_BYTES:
        raise ValueError(f"{name}: rows of {row} bytes: a MODEL1 cache has 584 bytes a token (448 e4m3, 64 bf16, "
                         f"8 scale bytes)")
    if bs == 0:
        raise ValueError(f"{name}: block_size (dim 1) is 0")
    if (row > 1 and strides[2] != 1) or (bs > 1 and strides[1] != row):
        raise ValueError(f"{name}: strides {strides}: a page's {bs}·584 bytes must be contiguous")
    need = model1_page_bytes(bs)
    stride = strides[0] if pages > 1 else need
    if stride % MODEL1_PAGE_ALIGN or stride < need:
        raise ValueError(f"{name}: pages {stride} bytes apart: MODEL1 pages are a multiple of 576 bytes apart, at "
                         f"least the {need} bytes of a page of {bs} tokens")
    return pages, bs, stride


def compute_capability_supported(major: int, minor: int) -> bool:
    major, minor = (_lib.integer(n, v, 0, _I32) for n, v in (("major", major), ("minor", minor)))
    return bool(_lib.query("dcp_mla_compute_capability_supported", major, minor, out_types=(c_int32,))[0])


def check_config(tp: int, dcp_size: int, interleave: int, block_size: int) -> None:
    """D in {1, 2, 4, 8} dividing tp, B ≥ 1, I ≥ 1 dividing B; DcpMlaValueError (INVALID_CONFIG:
    a DcpMlaError and a ValueError) otherwise."""
    _lib.call("dcp_mla_check_config", *_ints(tp=tp, dcp_size=dcp_size, interleave=interleave, block_size=block_size))


def check_topk(dcp_size: int, k: int) -> None:
    """K in {256, 512, 1024, 2048} and D·K a multiple of 512; DcpMlaValueError otherwise."""
    _lib.call("dcp_mla_check_topk", *_ints(dcp_size=dcp_size, k=k))


def check_decode(dcp_size: int, local_heads: int, num_q: int, batch: int, context: int) -> None:
    """The decode step's sizes, checked as the CLI's `plan` and `demo` check them: D in {1, 2, 4,
    8}, 1 ≤ D·local_heads ≤ 128, 1 ≤ num_q ≤ 8, batch ≥ 1, num_q ≤ context < 2^31;
    DcpMlaValueError (INVALID_CONFIG) naming the value otherwise."""
    _lib.call("dcp_mla_check_decode", *_ints(dcp_size=dcp_size, local_heads=local_heads, num_q=num_q, batch=batch,
                                             context=context))


def local_len(length: int, dcp_size: int, interleave: int, rank: int) -> int:
    """n_r(L): the tokens rank `rank` holds of a sequence of `length` tokens."""
    return _lib.query("dcp_mla_local_len", *_ints(dcp_size=dcp_size, interleave=interleave, rank=rank, length=length),
                      out_types=(c_uint64,))[0]


def token_address(t: int, dcp_size: int, interleave: int, block_size: int):
    """(owner rank, block-table column, slot) of global token `t`."""
    return tuple(_lib.query("dcp_mla_token_address", *_ints(dcp_size=dcp_size, interleave=interleave,
                                                            block_size=block_size, t=t),
                            out_types=(c_size_t, c_uint64, c_uint64)))


def causal_local_lens(lens: Sequence[int], qs: Sequence[int], dcp_size: int, interleave: int,
                      rank: int) -> List[int]:
    """Per-row local lengths of MTP rows on `rank`: request i of total length lens[i] (its qs[i]
    new tokens included), row j sees n_r(lens[i] − qs[i] + 1 + j) tokens; rows concatenated."""
    n = len(lens)
    if len(qs) != n:
        raise ValueError(f"qs: {len(qs)} entries for {n} lens")
    lens = [_lib.integer(f"lens[{i}]", v, 0, _U64) for i, v in enumerate(lens)]
    qs = [_lib.integer(f"qs[{i}]", v, 0, (1 << 32) - 1) for i, v in enumerate(qs)]
    dcp_size, interleave, rank = _ints(dcp_size=dcp_size, interleave=interleave, rank=rank)
    rows = sum(qs)
    out = (c_int32 * max(rows, 1))()
    _lib.call("dcp_mla_causal_local_lens", (c_uint64 * max(n, 1))(*lens), (c_uint32 * max(n, 1))(*qs), n,
              dcp_size, interleave, rank, out, rows)
    return list(out)[:rows]


def pages_for(length: int, dcp_size: int, block_size: int) -> int:
    """Pages every rank needs for one sequence of `length` tokens: ceil(L / (B·D))."""
    return _lib.query("dcp_mla_pages_for", *_ints(dcp_size=dcp_size, block_size=block_size, length=length),
                      out_types=(c_uint64,))[0]


def capacity(bytes_per_rank: int, kv_format, block_size: int, dcp_size: int):
    """(global tokens the group holds, pages per rank) with `bytes_per_rank` of cache per rank."""
    bytes_per_rank, block_size, dcp_size = _ints(bytes_per_rank=bytes_per_rank, block_size=block_size,
                                                 dcp_size=dcp_size)
    return tuple(_lib.query("dcp_mla_capacity", bytes_per_rank, kv_format_code(kv_format), block_size, dcp_size,
                            out_types=(c_uint64, c_uint64)))


def decode_num_splits(batch: int, num_q: int, heads: int, sparse: bool, num_sms: int = H200_SMS) -> int:
    """Split-KV parts for about one wave of `num_sms` decode CTAs, aligned with the sequences so
    that equal lengths split none (a function of the shapes only)."""
    return _lib.query("dcp_mla_decode_num_splits", *_ints(batch=batch, num_q=num_q, heads=heads), int(bool(sparse)),
                      *_ints(num_sms=num_sms), out_types=(c_size_t,))[0]


def decode_workspace_bytes(batch: int, num_q: int, heads: int, sparse: bool, num_splits: int) -> int:
    """Bytes of the split-KV workspace (0 for one split); `heads` is the gathered D·H_l."""
    return _lib.query("dcp_mla_decode_workspace_bytes", *_ints(batch=batch, num_q=num_q, heads=heads),
                      int(bool(sparse)), *_ints(num_splits=num_splits), out_types=(c_size_t,))[0]


def a2a_slot_bytes(num_tokens: int, local_heads: int) -> int:
    """Bytes of one a2a slot (one destination's share of a [D, slot] buffer), 16-aligned."""
    return _lib.query("dcp_mla_a2a_slot_bytes", *_ints(num_tokens=num_tokens, local_heads=local_heads),
                      out_types=(c_size_t,))[0]


def ag_rs_workspace_bytes(dcp_size: int, num_tokens: int, local_heads: int) -> int:
    return _lib.query("dcp_mla_ag_rs_workspace_bytes", *_ints(dcp_size=dcp_size, num_tokens=num_tokens,
                                                              local_heads=local_heads), out_types=(c_uint64,))[0]


def topk_workspace_bytes(dcp_size: int, rows: int, k: int) -> int:
    return _lib.query("dcp_mla_topk_workspace_bytes", *_ints(dcp_size=dcp_size, rows=rows, k=k),
                      out_types=(c_uint64,))[0]


@dataclasses.dataclass(frozen=True)
class PrefillPlan:
    """The prefix gather of a prefill batch: chunk length (a multiple of B·D), rows of each
    rank's flatten buffer, number of chunks, and the most pieces a chunk has."""
    chunk_tokens: int
    cap_rows: int
    num_chunks: int
    max_pieces: int


def _prefill_args(prefix_lens, dcp_size, interleave, block_size, budget_bytes):
    n = len(prefix_lens)
    prefix_lens = [_lib.integer(f"prefix_lens[{i}]", v, 0, _U64) for i, v in enumerate(prefix_lens)]
    return ((c_uint64 * max(n, 1))(*prefix_lens), n,
            *_ints(dcp_size=dcp_size, interleave=interleave, block_size=block_size, budget_bytes=budget_bytes))


def prefill_plan(prefix_lens: Sequence[int], dcp_size: int, interleave: int, block_size: int,
                 budget_bytes: int) -> PrefillPlan:
    return PrefillPlan(*_lib.query("dcp_mla_prefill_plan",
                                   *_prefill_args(prefix_lens, dcp_size, interleave, block_size, budget_bytes),
                                   out_types=(c_size_t,) * 4))


def prefill_piece_table(prefix_lens: Sequence[int], dcp_size: int, interleave: int, block_size: int,
                        budget_bytes: int, chunk: int) -> List[List[int]]:
    """Chunk `chunk`'s piece table: max_pieces rows of 8 int32 (upload it for the flatten and
    reorder), zero-padded."""
    pp = prefill_plan(prefix_lens, dcp_size, interleave, block_size, budget_bytes)
    table = (c_int32 * max(pp.max_pieces * 8, 1))()
    _lib.call("dcp_mla_prefill_piece_table", *_prefill_args(prefix_lens, dcp_size, interleave, block_size,
                                                            budget_bytes), *_ints(chunk=chunk), table, pp.max_pieces)
    flat = list(table)
    return [flat[i * 8:(i + 1) * 8] for i in range(pp.max_pieces)]


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one DCP group needs for a batch of requests of `context` tokens (docs/contract.md §1-§2)."""
    context: int
    dcp_size: int
    interleave: int
    block_size: int
    batch: int
    num_q: int
    local_heads: int
    heads: int
    kv_format: str
    #: n_r(context) for each rank r.
    local_lens: List[int]
    #: Block-table columns (pages) each rank needs per request: ceil(context / (B·D)).
    pages_per_request: int
    #: Bytes of one rank's cache for the batch (whole pages).
    cache_bytes_per_rank: int
    #: Split-KV parts and workspace bytes of the decode at `num_sms` SMs, dense and sparse.
    decode_splits: Dict[str, int]
    decode_workspace_bytes: Dict[str, int]
    #: Bytes of the combine buffers: one a2a slot, and the ag_rs buffers.
    a2a_slot_bytes: int
    ag_rs_workspace_bytes: int
    #: Bytes of the distributed top-k buffers (None without a top-k).
    topk_workspace_bytes: Optional[int]


def plan(context: int, dcp_size: int, *, interleave: int = 1, block_size: int = 64, batch: int = 1,
         num_q: int = 1, local_heads: int = 16, kv_format="fp8_656", topk: Optional[int] = 2048,
         tp: Optional[int] = None, num_sms: int = H200_SMS) -> Plan:
    """Plans a DCP group of `dcp_size` ranks for `batch` requests of `context` tokens, `num_q`
    query rows each, `local_heads` query heads per rank before the query-head all-gather
    (the decode runs D·local_heads). Raises DcpMlaValueError (a DcpMlaError and a ValueError)
    for a configuration the planner rejects, with the checks and messages of the CLI's `dcp-mla plan`: D not in {1, 2, 4, 8} or not
    dividing `tp`, I not dividing B, D·local_heads above 128, num_q outside 1..8, batch 0, a
    context shorter than num_q or beyond int32, D·K not a multiple of 512; TypeError /
    ValueError naming an argument that is not a non-negative integer."""
    context, dcp_size, interleave, block_size, batch, num_q, local_heads = _ints(
        context=context, dcp_size=dcp_size, interleave=interleave, block_size=block_size, batch=batch, num_q=num_q,
        local_heads=local_heads)
    check_config(tp if tp is not None else dcp_size, dcp_size, interleave, block_size)
    check_decode(dcp_size, local_heads, num_q, batch, context)
    if topk is not None:
        check_topk(dcp_size, topk)
    num_sms, = _ints(num_sms=num_sms)
    fmt = kv_format if isinstance(kv_format, str) else {v: k for k, v in KV_FORMATS.items()}[kv_format]
    kv_format_code(fmt)
    heads = dcp_size * local_heads
    pages = pages_for(context, dcp_size, block_size)
    splits = {"dense": decode_num_splits(batch, num_q, heads, False, num_sms),
              "sparse": decode_num_splits(batch, num_q, heads, True, num_sms)}
    tokens = batch * num_q
    return Plan(
        context=context, dcp_size=dcp_size, interleave=interleave, block_size=block_size, batch=batch,
        num_q=num_q, local_heads=local_heads, heads=heads, kv_format=fmt.lower(),
        local_lens=[local_len(context, dcp_size, interleave, r) for r in range(dcp_size)],
        pages_per_request=pages,
        cache_bytes_per_rank=batch * pages * block_size * TOKEN_BYTES[fmt.lower()],
        decode_splits=splits,
        decode_workspace_bytes={k: decode_workspace_bytes(batch, num_q, heads, k == "sparse", v)
                                for k, v in splits.items()},
        a2a_slot_bytes=a2a_slot_bytes(tokens, local_heads),
        ag_rs_workspace_bytes=ag_rs_workspace_bytes(dcp_size, tokens, local_heads),
        topk_workspace_bytes=None if topk is None else topk_workspace_bytes(dcp_size, tokens, topk),
    )
