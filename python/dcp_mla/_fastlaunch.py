"""The FlashMLA face's launch cache (dcp_mla.flash_mla): a copy of the argument struct of the
last launch made with a FlashMLASchedMeta through the fully checked path, replayed by later calls
whose key matches with only its data pointers rewritten.

Nothing here imports torch: tensors are read through `.shape`, `.stride()`, `.dtype`,
`.device` and `.data_ptr()` only, so python/tests/test_planner.py tests the key and the pointer
slots with stand-in objects, without torch or a GPU.

What a replay may reuse: every Python check of the face and of ops.decode_dense/decode_sparse,
and every value of the argument struct other than a data pointer, is a function of the tensors'
shapes, strides, dtypes and devices, of which arguments are None, of the scalars, of the current
stream and of the metadata's split count and workspace. The key holds all of these; the data
pointers (which differ from layer to layer of a step: each layer has its own q and cache) are
written into the struct on every call, outputs included. The C ABI checks every launch again
against the real allocations, replayed ones included.
"""

import ctypes
import threading

from . import _lib

get_ident = threading.get_ident


def tensor_key(x):
    """What a launch reads of a tensor argument other than its data pointer: shape, strides,
    dtype and device (None for an absent argument)."""
    if x is None:
        return None
    return (x.shape, x.stride(), x.dtype, x.device)


def launch_key(q, k_cache, block_table, cache_seqlens, indices, topk_length, attn_sink, head_dim_v,
               softmax_scale, causal, is_fp8_kvcache, stream):
    """The key of a face call at head dim 576: every tensor argument the launch reads (block_table
    and cache_seqlens only without indices: sparse decode does not read them) by tensor_key, the
    scalars, and the raw stream the launch goes to. Raises AttributeError or TypeError for an
    argument that is no tensor (the caller then takes the checked path, which names it)."""
    if indices is None:
        dense = (block_table.shape, block_table.stride(), block_table.dtype, block_table.device,
                 cache_seqlens.shape, cache_seqlens.stride(), cache_seqlens.dtype, cache_seqlens.device)
    else:
        dense = None
    return (q.shape, q.stride(), q.dtype, q.device,
            k_cache.shape, k_cache.stride(), k_cache.dtype, k_cache.device,
            dense,
            None if indices is None else (indices.shape, indices.stride(), indices.dtype, indices.device),
            None if topk_length is None else (topk_length.shape, topk_length.stride(), topk_length.dtype,
                                              topk_length.device),
            None if attn_sink is None else (attn_sink.shape, attn_sink.stride(), attn_sink.dtype, attn_sink.device),
            head_dim_v, softmax_scale, causal, is_fp8_kvcache, stream)


#: The tensor fields of decode_dense's and decode_sparse's argument structs, in order, and the
#: face argument each holds (the two structs share the layout: q out lse workspace cache, then
#: block_table/indices, lens/topk_len, sink).
FIELDS = {
    "dcp_mla_launch_decode_dense": ("q", "out", "lse", "workspace", "cache", "block_table", "lens", "sink"),
    "dcp_mla_launch_decode_sparse": ("q", "out", "lse", "workspace", "cache", "indices", "topk_len", "sink"),
}


def _layout(name):
    """(struct class, its words as a c_uint64 array type, the word index of the `data` of q, out,
    lse, cache, block_table or indices, lens or topk_len, sink)."""
    cls, names = _lib.ARGS[name], FIELDS[name]
    slots = tuple((getattr(cls, names[i]).offset + _lib.Tensor.data.offset) // 8 for i in (0, 1, 2, 4, 5, 6, 7))
    return cls, ctypes.c_uint64 * (ctypes.sizeof(cls) // 8), slots


_LAYOUTS = {name: _layout(name) for name in FIELDS}


class Launch:
    """One cached launch: the operation's entry point, its argument struct as the checked path
    filled it (schedule set to SCHEDULE_REUSE: the checked call computed the schedule or reused
    one), the word index of each rewritten data pointer, and what the replay allocates."""
    __slots__ = ("key", "thread", "workspace", "name", "fn", "buf", "ref", "words", "slots", "out_shape",
                 "lse_shape", "device", "index")

    def __init__(self, key, name, fn, filled, workspace, out_shape, lse_shape, device):
        cls, words, self.slots = _LAYOUTS[name]
        self.key = key
        self.thread = get_ident()
        self.workspace = workspace
        self.name = name
        self.fn = fn
        self.buf = cls.from_buffer_copy(filled)
        self.buf.schedule = _lib.SCHEDULE_REUSE
        self.ref = ctypes.byref(self.buf)
        self.words = words.from_buffer(self.buf)
        self.out_shape = out_shape
        self.lse_shape = lse_shape
        self.device = device
        self.index = getattr(device, "index", None)

    def write(self, q, out, lse, cache, second, third, sink):
        """Writes the call's data pointers (second, third: block_table and cache_seqlens, or
        indices and topk_length; absent ones, None, stay absent as the key says)."""
        w, s = self.words, self.slots
        w[s[0]] = q.data_ptr()
        w[s[1]] = out.data_ptr()
        w[s[2]] = lse.data_ptr()
        w[s[3]] = cache.data_ptr()
        w[s[4]] = second.data_ptr()
        if third is not None:
            w[s[5]] = third.data_ptr()
        if sink is not None:
            w[s[6]] = sink.data_ptr()

    def call(self):
        status = self.fn(self.ref)
        if status != 0:
            _lib.check(self.name, status)


def ops_key(tensors, scalars, stream):
    """The key of an ops.decode_dense / decode_sparse call: tensor_key of each of `tensors` (the
    arguments as given, None included), the call's other arguments as given (`scalars`, a
    tuple), and the raw stream it launches on."""
    return tuple(map(tensor_key, tensors)), scalars, stream


class OpLaunch:
    """One cached ops-level launch (ops.decode_dense, decode_sparse): the argument struct as the
    checked path filled it (its schedule code as that call's: reuse_schedule is in the key), and
    the word index of all eight tensors' data (q, out, lse, workspace, cache, block_table or
    indices, lens or topk_len, sink). A replay writes every one of them, so an absent tensor (its
    key None) stays 0."""
    __slots__ = ("key", "name", "fn", "buf", "ref", "words", "slots", "out_shape", "out_dtype", "lse_shape",
                 "device", "index", "ws_need")

    def __init__(self, key, name, fn, filled, out_shape, out_dtype, lse_shape, device, index, ws_need=0):
        cls, words, _ = _LAYOUTS[name]
        self.slots = tuple((getattr(cls, f).offset + _lib.Tensor.data.offset) // 8 for f in FIELDS[name])
        self.key = key
        self.name = name
        self.fn = fn
        self.buf = cls.from_buffer_copy(filled)
        self.ref = ctypes.byref(self.buf)
        self.words = words.from_buffer(self.buf)
        self.out_shape = out_shape
        self.out_dtype = out_dtype
        self.lse_shape = lse_shape
        self.device = device
        self.index = index
        self.ws_need = ws_need  # bytes of the library's own workspace a replay takes (0: the caller's or none)

    def write(self, tensors):
        """Writes the data pointers of the eight tensors, in FIELDS order (None: 0)."""
        w = self.words
        for s, x in zip(self.slots, tensors):
            w[s] = 0 if x is None else x.data_ptr()

    def call(self):
        status = self.fn(self.ref)
        if status != 0:
            _lib.check(self.name, status)
