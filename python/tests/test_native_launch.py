"""The native decode launches (dcp_mla._native, python/src/launch.rs) against ops.py's own:
for the same tensors, the argument struct the native side fills is the one _launch packs, byte
for byte, and whatever the native side does not read comes back as a fallback rather than as a
different struct. CPU tensors stand in for CUDA ones (the device and stream are given), so this
runs wherever torch does, without a GPU; test_gpu.py launches both ways on the device."""

import ctypes

import pytest

torch = pytest.importorskip("torch")

from dcp_mla import _lib, ops  # noqa: E402

DEV, STREAM = 0x1234_5000, 0x9876_5400
SCALE = 0.1352337788608801


@pytest.fixture(scope="module")
def native():
    if ops._NATIVE is None:
        if hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
            pytest.fail("torch publishes __dlpack_c_exchange_api__ but ops bound no native launch")
        pytest.skip(f"torch {torch.__version__} publishes no DLPack C exchange API")
    return ops._NATIVE


def filled(native_fn, name, *args):
    """The struct a native entry point fills from `args` (with DEV and STREAM as stand-ins, not
    launched), as bytes; None where it falls back (the struct left untouched then)."""
    buf = _lib.ARGS[name]()
    before = bytes(buf)
    status = native_fn(ctypes.addressof(buf), ctypes.sizeof(buf), *args, stand_in=(DEV, STREAM))
    if status == ops._FALLBACK:
        assert bytes(buf) == before, "a fallback wrote the struct"
        return None
    assert status == 0
    return bytes(buf)


def packed(name, values):
    cls = _lib.ARGS[name]
    buf = cls()
    _lib.packer(cls).pack_into(buf, 0, ctypes.sizeof(cls), DEV, STREAM, *values)
    return bytes(buf)


def bf16(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


def dense_case(b=3, nq=2, h=16, pages=7, bs=64, max_pages=4, *, q_view=False, out_dtype=torch.bfloat16,
               out_view=False, lse_fmla=False, ws=True, cache_view=None, table_view=False, lens_bcast=False,
               sink=False):
    q = bf16(b, nq, h + 8, 576)[:, :, :h] if q_view else bf16(b, nq, h, 576)
    out = torch.empty(b, nq, h, 512 + (64 if out_view else 0), dtype=out_dtype)[..., :512]
    lse = torch.empty(b, h, nq).transpose(1, 2) if lse_fmla else torch.empty(b, nq, h)
    if cache_view == "pages":
        cache = bf16(pages, bs + 3, 576)[:, :bs]
    elif cache_view == "4d":
        cache = bf16(pages, bs, 1, 576).select(2, 0)
    else:
        cache = bf16(pages, bs, 576)
    table = torch.arange(b * (max_pages + 2), dtype=torch.int32).view(b, max_pages + 2)
    table = table[:, 1:max_pages + 1] if table_view else table[:, :max_pages].contiguous()
    lens = torch.full((b,), 100, dtype=torch.int32).view(b, 1).expand(b, nq) if lens_bcast else \
        torch.full((b, nq), 100, dtype=torch.int32)
    return (q, cache, table, lens, out, lse, torch.empty(4096, dtype=torch.uint8) if ws else None,
            torch.randn(h) if sink else None)


DENSE_CASES = {
    "contiguous": {},
    "q view": {"q_view": True},
    "f32 out view": {"out_dtype": torch.float32, "out_view": True},
    "FlashMLA lse": {"lse_fmla": True},
    "no workspace": {"ws": False},
    "pages apart": {"cache_view": "pages"},
    "one page apart": {"cache_view": "pages", "pages": 1},
    "4-d cache": {"cache_view": "4d"},
    "table view": {"table_view": True},
    "broadcast lens": {"lens_bcast": True},
    "sink": {"sink": True},
    "one row a request": {"nq": 1, "q_view": True, "lse_fmla": True},
    "empty batch": {"b": 0},
}


@pytest.mark.parametrize("case", DENSE_CASES)
@pytest.mark.parametrize("scalars", [(128, 0, 0, 0, 1, 1, 0), (1, 1, 2, 1, 4, 8, 3)])
def test_dense_struct_is_ops_struct(native, case, scalars):
    q, cache, table, lens, out, lse, ws, sink = dense_case(**DENSE_CASES[case])
    num_splits, schedule, lens_rule, empty_lse_inf, dcp, interleave, rank = scalars
    got = filled(native.decode_dense, ops._DENSE, q, cache, table, lens, out, lse, ws, sink, SCALE, num_splits, schedule,
                 lens_rule, empty_lse_inf, dcp, interleave, rank)
    want = packed(ops._DENSE, ops._dense_values(q, cache, table, lens, out, lse, ws, SCALE, num_splits, schedule, sink,
                                                empty_lse_inf, lens_rule, dcp, interleave, rank))
    assert got is not None and got == want


def sparse_case(b=2, nq=1, h=64, pages=5, bs=64, topk=512, *, fp8=True, dtype=torch.uint8, idx_view=False,
                topk_len=None):
    q = bf16(b, nq, h, 576)
    if fp8:
        cache = torch.randint(0, 255, (pages, bs, 656), dtype=torch.uint8).view(dtype)
    else:
        cache = bf16(pages, bs, 576)
    idx = torch.randint(-1, pages * bs, (b, nq, topk + (16 if idx_view else 0)), dtype=torch.int32)
    idx = idx[..., 8:8 + topk] if idx_view else idx
    if topk_len == "bcast":
        tl = torch.full((b,), topk, dtype=torch.int32).view(b, 1).expand(b, nq)
    elif topk_len == "rows":
        tl = torch.full((b, nq), topk, dtype=torch.int32)
    else:
        tl = None
    out, lse = torch.empty(b, nq, h, 512, dtype=torch.bfloat16), torch.empty(b, nq, h)
    return q, cache, idx, tl, out, lse, torch.empty(8192, dtype=torch.uint8), None


SPARSE_CASES = {
    "fp8 uint8": {},
    "fp8 int8": {"dtype": torch.int8},
    "bf16 cache": {"fp8": False},
    "index view, mtp": {"idx_view": True, "nq": 2},
    "topk_len rows": {"topk_len": "rows", "nq": 2},
    "topk_len broadcast": {"topk_len": "bcast", "nq": 3},
}
if hasattr(torch, "float8_e4m3fn"):
    SPARSE_CASES["fp8 e4m3fn"] = {"dtype": torch.float8_e4m3fn}


@pytest.mark.parametrize("case", SPARSE_CASES)
def test_sparse_struct_is_ops_struct(native, case):
    q, cache, idx, tl, out, lse, ws, sink = sparse_case(**SPARSE_CASES[case])
    fmt = _lib.KV_FP8_656 if cache.element_size() == 1 else _lib.KV_BF16
    got = filled(native.decode_sparse, ops._SPARSE, q, cache, idx, tl, out, lse, ws, sink, SCALE, fmt, 64, 1, 1)
    want = packed(ops._SPARSE, ops._sparse_values(q, cache, fmt, idx, tl, out, lse, ws, SCALE, 64, 1, sink, 1))
    assert got is not None and got == want


class NotATensor:
    shape = (1, 1, 1, 576)


@pytest.mark.parametrize("what", ["f16 q", "f64 lse", "no tensor", "3-d q", "negative splits", "rank over i32",
                                  "huge scale", "scalar tensor table"])
def test_dense_falls_back_where_it_cannot_read(native, what):
    """Each of these makes ops.py's own path raise (naming the argument) or pack a value the
    native side does not know: the native side must leave the call to it, not fill a struct."""
    q, cache, table, lens, out, lse, ws, sink = dense_case()
    scalars = [128, 0, 0, 0, 1, 1, 0]
    scale = SCALE
    if what == "f16 q":
        q = q.half()
    elif what == "f64 lse":
        lse = lse.double()
    elif what == "no tensor":
        cache = NotATensor()
    elif what == "3-d q":
        q = q[0]
    elif what == "negative splits":
        scalars[0] = -1
    elif what == "rank over i32":
        scalars[2] = 1 << 31
    elif what == "huge scale":
        scale = 1e300
    elif what == "scalar tensor table":
        table = torch.tensor(3, dtype=torch.int32)
    assert filled(native.decode_dense, ops._DENSE, q, cache, table, lens, out, lse, ws, sink, scale, *scalars) is None


def test_bind_refuses_other_capsules(native):
    with pytest.raises((TypeError, ValueError)):
        native.bind_tensor_api(object())
    with pytest.raises(ValueError):
        native.register_device(64, 1)


def test_launch_without_a_device_falls_back(native):
    """CPU tensors (and a CUDA device with no handle registered) never reach the library: the
    call comes back as a fallback and the struct at `dst` is untouched."""
    q, cache, table, lens, out, lse, ws, sink = dense_case()
    buf = _lib.ARGS[ops._DENSE]()
    before = bytes(buf)
    status = native.decode_dense(ctypes.addressof(buf), ctypes.sizeof(buf), q, cache, table, lens, out, lse, ws, sink,
                                 SCALE, 128, 0, 0, 0, 1, 1, 0)
    assert status == native.FALLBACK and bytes(buf) == before


def key_variants():
    """Tensors that differ from the first in exactly one fact a launch reads: shape, a stride,
    dtype (the three byte types among them), being absent; and one that differs in data only."""
    base = torch.zeros(4, 8, 16, dtype=torch.bfloat16)
    wide = torch.zeros(4, 8, 32, dtype=torch.bfloat16)
    cache = torch.zeros(6, 64, 656, dtype=torch.uint8)
    out = [
        ("base", base),
        ("other data", torch.ones(4, 8, 16, dtype=torch.bfloat16)),
        ("shape", torch.zeros(4, 8, 15, dtype=torch.bfloat16)),
        ("strides", wide[..., :16]),
        ("transposed", torch.zeros(8, 4, 16, dtype=torch.bfloat16).transpose(0, 1)),
        ("dtype f32", torch.zeros(4, 8, 16)),
        ("u8", cache),
        ("i8", cache.view(torch.int8)),
        ("absent", None),
    ]
    if hasattr(torch, "float8_e4m3fn"):
        out.append(("e4m3", cache.view(torch.float8_e4m3fn)))
    return out


def test_tensor_key_tells_apart_what_ops_key_tells_apart(native):
    """The native key of a replay (ops._op_key's bytes) equals another's exactly where
    _fastlaunch.ops_key's tuples do: the same facts, in any position of the tuple."""
    from dcp_mla._fastlaunch import ops_key
    variants = key_variants()
    for pos in (0, 3, 7):
        for name_a, a in variants:
            for name_b, b in variants:
                ta = tuple(a if i == pos else None for i in range(8))
                tb = tuple(b if i == pos else None for i in range(8))
                ka, kb = native.tensor_key(ta), native.tensor_key(tb)
                assert ka is not None and kb is not None
                assert (ka == kb) == (ops_key(ta, (), 0) == ops_key(tb, (), 0)), (pos, name_a, name_b)


def test_tensor_key_leaves_unreadable_tensors_to_python(native):
    assert native.tensor_key((torch.zeros(3, dtype=torch.float16),)) is None
    assert native.tensor_key((NotATensor(),)) is None
    assert ops._op_key((torch.zeros(3, dtype=torch.float16),), (), 0) == \
        __import__("dcp_mla._fastlaunch", fromlist=["ops_key"]).ops_key((torch.zeros(3, dtype=torch.float16),), (), 0)


def test_replay_falls_back_before_writing(native):
    """A replay of a struct of another size, or with a tensor it cannot read, writes nothing and
    launches nothing (the caller then takes ctypes)."""
    q, cache, table, lens, out, lse, ws, sink = dense_case()
    buf = _lib.ARGS[ops._DENSE]()
    before = bytes(buf)
    full = (q, out, lse, ws, cache, table, lens, sink)
    assert native.replay_decode(False, ctypes.addressof(buf), ctypes.sizeof(buf) - 8, full) == native.FALLBACK
    assert native.replay_decode(True, ctypes.addressof(buf), ctypes.sizeof(buf) + 8, full) == native.FALLBACK
    odd = (q, out, lse, ws, NotATensor(), table, lens, sink)
    assert native.replay_decode(False, ctypes.addressof(buf), ctypes.sizeof(buf), odd) == native.FALLBACK
    assert native.replay_decode(False, ctypes.addressof(buf), ctypes.sizeof(buf), full[:7]) == native.FALLBACK
    assert bytes(buf) == before
