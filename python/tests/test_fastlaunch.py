"""The FlashMLA face's launch cache (dcp_mla._fastlaunch) without torch or a GPU: the key changes
with everything a launch reads other than a data pointer, and a replay rewrites exactly the data
pointers of the argument struct. Tensors are stand-ins with torch's attribute names."""

import ctypes

import pytest

from dcp_mla import _fastlaunch, _lib
from dcp_mla._fastlaunch import Launch, launch_key

DENSE, SPARSE = "dcp_mla_launch_decode_dense", "dcp_mla_launch_decode_sparse"


class T:
    """A stand-in tensor: shape, strides, dtype, device and data pointer."""

    def __init__(self, shape, stride=None, dtype="bf16", device="cuda:0", ptr=0x1000):
        self.shape, self._stride, self.dtype, self.device, self._ptr = tuple(shape), stride, dtype, device, ptr
        if stride is None:
            acc, st = 1, []
            for n in reversed(self.shape):
                st.append(acc)
                acc *= n
            self._stride = tuple(reversed(st))

    def stride(self):
        return tuple(self._stride)

    def data_ptr(self):
        return self._ptr


def dense_args(**change):
    args = dict(q=T((4, 1, 16, 576), ptr=0x10000), k_cache=T((8, 64, 1, 576), ptr=0x20000),
                block_table=T((4, 2), dtype="i32", ptr=0x30000), cache_seqlens=T((4,), dtype="i32", ptr=0x40000),
                indices=None, topk_length=None, attn_sink=None, head_dim_v=512, softmax_scale=None, causal=False,
                is_fp8_kvcache=False, stream=0)
    args.update(change)
    return args


def sparse_args(**change):
    args = dense_args(indices=T((4, 1, 512), dtype="i32", ptr=0x50000), topk_length=T((4,), dtype="i32", ptr=0x60000),
                      k_cache=T((8, 64, 1, 656), dtype="u8", ptr=0x20000), is_fp8_kvcache=True)
    args.update(change)
    return args


def key(args):
    return launch_key(**args)


def variants(name, x):
    """x with each of its shape, strides, dtype and device changed in turn, and absent."""
    shape = x.shape[:-1] + (x.shape[-1] + 1,)
    stride = tuple(s * 2 for s in x.stride()[:-1]) + (1,)
    yield f"{name} shape", T(shape, None, x.dtype, x.device, x._ptr)
    if len(x.shape) > 1:
        yield f"{name} stride", T(x.shape, stride, x.dtype, x.device, x._ptr)
    yield f"{name} dtype", T(x.shape, x.stride(), "f32", x.device, x._ptr)
    yield f"{name} device", T(x.shape, x.stride(), x.dtype, "cuda:1", x._ptr)
    yield f"{name} absent", None


@pytest.mark.parametrize("make", [dense_args, sparse_args])
def test_key_changes_with_every_tensor_attribute_but_the_pointer(make):
    base = make()
    k0 = key(base)
    read = ["q", "k_cache", "attn_sink"] + (["indices", "topk_length"] if base["indices"] is not None
                                            else ["block_table", "cache_seqlens"])
    for name in read:
        x = base[name] if base[name] is not None else T((16,), dtype="f32", ptr=0x70000)
        for what, y in variants(name, x):
            if y is None and base[name] is None:
                continue
            try:
                k = key(make(**{name: y}))
            except AttributeError:
                continue  # an absent required tensor: no key, the checked path raises
            assert k != k0, what
    # a data pointer is no part of the key: it is written into the struct on every call
    for name in read:
        if base[name] is not None:
            x = base[name]
            moved = T(x.shape, x.stride(), x.dtype, x.device, x._ptr + 0x100000)
            assert key(make(**{name: moved})) == k0, name


@pytest.mark.parametrize("make", [dense_args, sparse_args])
def test_key_changes_with_every_scalar_and_the_stream(make):
    k0 = key(make())
    for name, value in [("head_dim_v", 576), ("softmax_scale", 0.07), ("causal", True),
                        ("is_fp8_kvcache", not make()["is_fp8_kvcache"]), ("stream", 0x1234)]:
        assert key(make(**{name: value})) != k0, name


def test_sparse_key_ignores_what_sparse_decode_does_not_read():
    k0 = key(sparse_args())
    assert key(sparse_args(block_table=None, cache_seqlens=None)) == k0
    assert key(sparse_args(block_table=T((9, 9)), cache_seqlens=T((3,), dtype="i64"))) == k0


def test_key_of_a_non_tensor_raises_for_the_checked_path():
    with pytest.raises(AttributeError):
        key(dense_args(q=[1, 2, 3]))
    with pytest.raises(AttributeError):
        key(dense_args(block_table=None))


def filled_struct(name):
    """The operation's argument struct with every scalar a distinct value (schedule COMPUTE)."""
    cls = _lib.ARGS[name]
    leaves = _lib.leaves(cls)
    values = []
    for i, (path, _, t) in enumerate(leaves):
        if t is ctypes.c_float:
            values.append(0.5)
        elif path == "schedule":
            values.append(_lib.SCHEDULE_COMPUTE)
        elif t is ctypes.c_int32 or t is ctypes.c_uint32:
            values.append(i)
        else:
            values.append(0xA0000 + i)
    buf = cls()
    _lib.packer(cls).pack_into(buf, 0, *values)
    return cls, buf


@pytest.mark.parametrize("name", [DENSE, SPARSE])
def test_replay_rewrites_exactly_the_data_pointers(name):
    cls, filled = filled_struct(name)
    entry = Launch("k", name, None, filled, None, (1,), (1,), "cuda:0")
    assert entry.buf.schedule == _lib.SCHEDULE_REUSE and filled.schedule == _lib.SCHEDULE_COMPUTE
    ptrs = dict(q=0x111000, out=0x222000, lse=0x333000, cache=0x444000, second=0x555000, third=0x666000,
                sink=0x777000)
    entry.write(*(T((1,), ptr=p) for p in ptrs.values()))
    fields = _fastlaunch.FIELDS[name]
    want = {fields[0]: ptrs["q"], fields[1]: ptrs["out"], fields[2]: ptrs["lse"], fields[4]: ptrs["cache"],
            fields[5]: ptrs["second"], fields[6]: ptrs["third"], fields[7]: ptrs["sink"]}
    for path, off, t in _lib.leaves(cls):
        got = t.from_buffer(entry.buf, off).value
        old = t.from_buffer(filled, off).value
        field, _, leaf = path.partition(".")
        if leaf == "data" and field in want:
            assert got == want[field], path
        elif path == "schedule":
            assert got == _lib.SCHEDULE_REUSE
        else:
            assert got == old, path
    # absent third tensor and sink: their words stay as the checked call left them
    entry2 = Launch("k", name, None, filled, None, (1,), (1,), "cuda:0")
    entry2.write(*(T((1,), ptr=p) for p in list(ptrs.values())[:5]), None, None)
    assert getattr(entry2.buf, fields[6]).data == getattr(filled, fields[6]).data
    assert getattr(entry2.buf, fields[7]).data == getattr(filled, fields[7]).data


def test_the_fields_match_the_argument_structs():
    for name, fields in _fastlaunch.FIELDS.items():
        tensors = [f for f, t in _lib.ARGS[name]._fields_ if t is _lib.Tensor]
        assert tuple(tensors) == fields, name


def test_replay_raises_the_library_status():
    _, filled = filled_struct(DENSE)
    calls = []

    def fn(ref):
        calls.append(ref)
        return len(calls) - 1  # SUCCESS, then INVALID_ARGUMENT

    entry = Launch("k", DENSE, fn, filled, None, (1,), (1,), "cuda:0")
    entry.call()
    with pytest.raises(_lib.DcpMlaValueError, match=DENSE):
        entry.call()


# --- the ops-level cache (ops.decode_dense / decode_sparse: _fastlaunch.OpLaunch) -------------

def test_ops_key_changes_with_every_tensor_attribute_scalar_and_stream_but_the_pointer():
    tensors = (T((4, 1, 16, 576), ptr=0x10000), None, None, T((4096,), dtype="u8", ptr=0x80000),
               T((8, 64, 576), ptr=0x20000), T((4, 2), dtype="i32", ptr=0x30000),
               T((4, 1), dtype="i32", ptr=0x40000), None)
    scalars = (None, 8, "bf16", False, False, "local", 1, 1, 0)
    k0 = _fastlaunch.ops_key(tensors, scalars, 0)
    moved = tuple(None if x is None else T(x.shape, x.stride(), x.dtype, x.device, x._ptr + 0x100) for x in tensors)
    assert _fastlaunch.ops_key(moved, scalars, 0) == k0
    for i, x in enumerate(tensors):
        x = x if x is not None else T((16,), dtype="f32", ptr=0x70000)
        for what, y in variants(f"tensor {i}", x):
            if y is None and tensors[i] is None:
                continue
            changed = tensors[:i] + (y,) + tensors[i + 1:]
            assert _fastlaunch.ops_key(changed, scalars, 0) != k0, what
    for i in range(len(scalars)):
        changed = scalars[:i] + ("other",) + scalars[i + 1:]
        assert _fastlaunch.ops_key(tensors, changed, 0) != k0, f"scalar {i}"
    assert _fastlaunch.ops_key(tensors, scalars, 0x5000) != k0


@pytest.mark.parametrize("name", [DENSE, SPARSE])
def test_op_replay_rewrites_every_data_pointer_and_nothing_else(name):
    cls, filled = filled_struct(name)
    entry = _fastlaunch.OpLaunch("k", name, None, filled, (1,), "bf16", (1,), "cuda:0", 0)
    fields = _fastlaunch.FIELDS[name]
    # the schedule code stays the checked call's (reuse_schedule is in the key)
    assert entry.buf.schedule == _lib.SCHEDULE_COMPUTE
    tensors = [T((1,), ptr=0x100000 * (i + 1)) for i in range(8)]
    tensors[7] = None  # an absent sink is written 0
    entry.write(tensors)
    want = {f: (0 if x is None else x.data_ptr()) for f, x in zip(fields, tensors)}
    for path, off, t in _lib.leaves(cls):
        got = t.from_buffer(entry.buf, off).value or 0
        field, _, leaf = path.partition(".")
        if leaf == "data" and field in want:
            assert got == want[field], path
        else:
            assert got == (t.from_buffer(filled, off).value or 0), path
