"""MODEL1 (FlashMLA's d_qk = 512 sparse path) without a GPU: the cache geometry the package reads
(docs/contract.md §3, "MODEL1"), the C ABI's MODEL1 launchers through ctypes, refused by field
before they need a device, and, where torch is installed (on the CPU is enough), the FlashMLA
face's argument checks on the MODEL1 path. CI runs the first two (no torch there)."""

import ctypes

import pytest

import dcp_mla
from dcp_mla import DcpMlaError, DcpMlaValueError, _lib


# --- the cache geometry (torch-free) ---------------------------------------------------------------

@pytest.mark.parametrize("block_size,page_bytes", [(1, 1152), (2, 1728), (3, 2304), (61, 35712), (64, 37440),
                                                   (72, 42048), (256, 149760)])
def test_model1_page_bytes_is_584_b_rounded_up_to_576(block_size, page_bytes):
    # 584·B bytes (576 of value row and 8 of scales a token), padded to a multiple of 576
    assert dcp_mla.model1_page_bytes(block_size) == page_bytes
    assert page_bytes % 576 == 0 and 584 * block_size <= page_bytes < 584 * block_size + 576


def test_model1_default_scale():
    assert dcp_mla.model1_default_scale() == pytest.approx(512 ** -0.5, rel=1e-12)
    assert dcp_mla.model1_default_scale() != pytest.approx(dcp_mla.default_scale())


def test_model1_pages_reads_flashmla_layouts():
    # FlashMLA's quantize_k_cache: [num_blocks, padded] bytes viewed [num_blocks, B, 1, 584]
    for b in (2, 61, 64):
        padded = dcp_mla.model1_page_bytes(b)
        assert dcp_mla.model1_pages((5, b, 1, 584), (padded, 584, 584, 1)) == (5, b, padded)
        assert dcp_mla.model1_pages((5, b, 584), (padded, 584, 1)) == (5, b, padded)
        # a view of a wider page dimension: any multiple of 576 beyond a page
        assert dcp_mla.model1_pages((5, b, 1, 584), (padded + 1152, 584, 584, 1))[2] == padded + 1152
        # one page: its stride is never used
        assert dcp_mla.model1_pages((1, b, 1, 584), (7, 584, 584, 1)) == (1, b, padded)
    # B = 72 packs exactly: a contiguous [pages, 72, 1, 584] tensor is a valid cache
    assert dcp_mla.model1_pages((3, 72, 1, 584), (72 * 584, 584, 584, 1)) == (3, 72, 42048)


@pytest.mark.parametrize("shape,strides,needle", [
    ((4, 64, 1, 584), (64 * 584, 584, 584, 1), "multiple of 576"),  # packed, unpadded pages
    ((4, 64, 1, 584), (36864, 584, 584, 1), "multiple of 576"),  # a page of 64 needs 37440
    ((4, 64, 1, 584), (37440 + 100, 584, 584, 1), "multiple of 576"),
    ((4, 64, 1, 656), (64 * 656, 656, 656, 1), "584 bytes"),  # an FP8-656 cache
    ((4, 64, 2, 584), (37440, 1168, 584, 1), "one KV head"),
    ((4, 64, 1, 584), (37440, 600, 584, 1), "contiguous"),
    ((4, 0, 1, 584), (37440, 584, 584, 1), "block_size"),
    ((4, 64 * 584), (37440, 1), "expected FlashMLA's MODEL1"),
])
def test_model1_pages_refuses_by_name(shape, strides, needle):
    with pytest.raises(ValueError, match="^extra_cache: ") as e:
        dcp_mla.model1_pages(shape, strides, "extra_cache")
    assert needle in str(e.value), str(e.value)


# --- the C ABI's MODEL1 launchers through ctypes, no device ------------------------------------------

def _tensor(t, addr, numel, dtype):
    t.data, t.numel, t.dtype = addr, numel, dtype


def _decode_args(extra=True):
    """A MODEL1 decode of 2 requests, 64 heads over 8 pages of 64 tokens and, with `extra`, 3
    pages of 2 tokens: fake device addresses, never dereferenced (no device is given)."""
    cls = _lib.ARGS["dcp_mla_launch_decode_model1"]
    a = cls(struct_size=ctypes.sizeof(cls))
    rows = 2 * 64
    _tensor(a.q, 0x1000_0000, rows * 512, _lib.DTYPE_BF16)
    _tensor(a.out, 0x2000_0000, rows * 512, _lib.DTYPE_BF16)
    _tensor(a.lse, 0x3000_0000, rows, _lib.DTYPE_F32)
    _tensor(a.cache, 0x4000_0000, 8 * 37440, _lib.DTYPE_U8)
    _tensor(a.indices, 0x5000_0000, 2 * 128, _lib.DTYPE_I32)
    # FlashMLA's per-request topk_length [b] as a [b, num_q] view: strides (1, 0)
    _tensor(a.topk_len, 0x5100_0000, 2, _lib.DTYPE_I32)
    a.topk_len.num_strides, a.topk_len.strides[0] = 2, 1
    a.batch, a.num_q, a.heads, a.num_splits, a.num_pages, a.block_size, a.topk = 2, 1, 64, 1, 8, 64, 128
    if extra:
        _tensor(a.extra_cache, 0x6000_0000, 3 * 1728, _lib.DTYPE_U8)
        _tensor(a.extra_indices, 0x7000_0000, 2 * 64, _lib.DTYPE_I32)
        a.extra_num_pages, a.extra_block_size, a.extra_topk = 3, 2, 64
    return a


def _refused(name, args):
    with pytest.raises(DcpMlaError) as e:
        _lib.call(name, args)
    return e.value


def test_model1_decode_without_a_device_is_refused_by_field():
    name = "dcp_mla_launch_decode_model1"
    # well formed, with one source or two, and scale 0 (MODEL1's default): as far as the device
    for extra in (False, True):
        e = _refused(name, _decode_args(extra))
        assert e.status == "NULL_POINTER" and "`device`" in e.message, e.message
    a = _decode_args()
    a.extra_indices.dtype = _lib.DTYPE_F32
    e = _refused(name, a)
    assert e.status == "BAD_DTYPE" and "`extra_indices`" in e.message
    a = _decode_args()
    a.extra_indices.data = None
    e = _refused(name, a)
    assert e.status == "NULL_POINTER" and "`extra_indices`" in e.message
    a = _decode_args()
    a.extra_cache.num_strides = 2
    e = _refused(name, a)
    assert isinstance(e, DcpMlaValueError) and "`extra_cache.num_strides`" in e.message
    a = _decode_args()
    a._reserved = 1
    assert "`_reserved`" in _refused(name, a).message
    # a second source's field without its cache is refused, not ignored
    for field, value in [("extra_num_pages", 3), ("extra_block_size", 2), ("extra_topk", 64)]:
        a = _decode_args(extra=False)
        setattr(a, field, value)
        e = _refused(name, a)
        assert isinstance(e, DcpMlaValueError) and f"`{field}`" in e.message and "extra_cache is absent" in e.message
    a = _decode_args(extra=False)
    _tensor(a.extra_topk_len, 0x7100_0000, 2, _lib.DTYPE_I32)
    assert "`extra_topk_len`" in _refused(name, a).message
    a = _decode_args()
    a.struct_size = 64
    assert "`DcpMlaDecodeModel1Args.struct_size`" in _refused(name, a).message


def test_model1_fill_without_a_device_is_refused_by_field():
    name = "dcp_mla_launch_kv_fill_model1"
    cls = _lib.ARGS[name]
    a = cls(struct_size=ctypes.sizeof(cls))
    _tensor(a.ckv, 0x1000_0000, 4 * 448, _lib.DTYPE_BF16)
    _tensor(a.kpe, 0x2000_0000, 4 * 64, _lib.DTYPE_BF16)
    _tensor(a.req_idx, 0x3000_0000, 4, _lib.DTYPE_I32)
    _tensor(a.positions, 0x3100_0000, 4, _lib.DTYPE_I32)
    _tensor(a.block_table, 0x3200_0000, 8, _lib.DTYPE_I32)
    _tensor(a.cache, 0x4000_0000, 8 * 37440, _lib.DTYPE_U8)
    a.batch, a.max_pages, a.num_pages, a.block_size, a.dcp_size, a.interleave, a.rank = 1, 8, 8, 64, 1, 1, 0
    e = _refused(name, a)
    assert e.status == "NULL_POINTER" and "`device`" in e.message
    a.kpe.dtype = _lib.DTYPE_F32
    e = _refused(name, a)
    assert e.status == "BAD_DTYPE" and "`kpe`" in e.message
    a.kpe.dtype = _lib.DTYPE_BF16
    a.ckv.data = 0x1000_0001
    assert _refused(name, a).status == "MISALIGNED"


def test_model1_structs_fill_in_one_pack():
    # the fast fill writes what ctypes reads back, field by field, for both MODEL1 structs
    for fn in ("dcp_mla_launch_decode_model1", "dcp_mla_launch_kv_fill_model1"):
        cls = _lib.ARGS[fn]
        leaves = _lib.leaves(cls)
        values = [0.5 if t is ctypes.c_float else i + 1 for i, (_, _, t) in enumerate(leaves)]
        buf = cls()
        _lib.packer(cls).pack_into(buf, 0, *values)
        for (path, _, t), v in zip(leaves, values):
            obj = buf
            for part in path.replace("]", "").replace("[", ".").split("."):
                obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
            assert obj == v, (fn, path)


# --- the FlashMLA face's MODEL1 checks (torch, on the CPU) -----------------------------------------

def _face_inputs():
    torch = pytest.importorskip("torch")
    b, s_q, h = 2, 1, 16
    q = torch.zeros(b, s_q, h, 512, dtype=torch.bfloat16)
    padded = dcp_mla.model1_page_bytes(64)
    k_cache = torch.zeros(4, padded, dtype=torch.uint8)[:, :64 * 584].view(4, 64, 1, 584)
    indices = torch.full((b, s_q, 32), -1, dtype=torch.int32)
    return torch, q, k_cache, indices


def test_flash_mla_face_model1_argument_checks():
    torch, q, k_cache, indices = _face_inputs()
    from dcp_mla.flash_mla import flash_mla_with_kvcache, get_mla_metadata

    def call(**kw):
        args = dict(q=q, k_cache=k_cache, block_table=None, cache_seqlens=None, head_dim_v=512,
                    tile_scheduler_metadata=get_mla_metadata()[0], is_fp8_kvcache=True, indices=indices)
        args.update(kw)
        return flash_mla_with_kvcache(**args)

    lens = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="^indices: "):
        call(indices=None)
    with pytest.raises(ValueError, match="^causal: "):
        call(causal=True)
    with pytest.raises(ValueError, match="^is_fp8_kvcache: "):
        call(is_fp8_kvcache=False)
    with pytest.raises(ValueError, match="^k_cache: rows of 656 bytes"):
        call(k_cache=torch.zeros(4, 64, 1, 656, dtype=torch.uint8))
    with pytest.raises(ValueError, match="^extra_indices_in_kvcache: required with extra_k_cache"):
        call(extra_k_cache=k_cache)
    with pytest.raises(ValueError, match="^extra_k_cache: required with extra_indices_in_kvcache"):
        call(extra_indices_in_kvcache=indices)
    with pytest.raises(ValueError, match="^extra_topk_length: only with extra_k_cache"):
        call(extra_topk_length=lens)
    with pytest.raises(ValueError, match="^head_dim_v: "):
        call(head_dim_v=448)
    # head dim 576 keeps the second source to MODEL1's path, as FlashMLA's tests use it
    q576 = torch.zeros(2, 1, 16, 576, dtype=torch.bfloat16)
    k656 = torch.zeros(4, 64, 1, 656, dtype=torch.uint8)
    for field in ("extra_k_cache", "extra_indices_in_kvcache", "extra_topk_length"):
        value = {"extra_k_cache": k656, "extra_indices_in_kvcache": indices, "extra_topk_length": lens}[field]
        with pytest.raises(NotImplementedError, match=f"^{field}: "):
            call(q=q576, k_cache=k656, **{field: value})
