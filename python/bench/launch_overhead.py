"""Host time per eager launch of the package's operations (µs), against the bare C ABI call and
an empty torch op, on the current GPU. Prints a JSON object (and writes it to argv[1] if given).

The overhead of an op is its host time per call in a loop of back-to-back launches of a tiny
problem (the GPU keeps up, so the host is the limit): argument checks, allocation of outputs not
passed, filling the operation's argument struct, the call and the C ABI's own validation.
decode_dense and decode_sparse fill their struct natively where torch publishes the DLPack C
exchange API (`native_launch` in the report; python/src/launch.rs): `..., C ABI call only` is
then the native call, `..., ctypes path` the same launch as ops.py packs it for ctypes.
`flash_mla_with_kvcache face` is the decode_dense problem through dcp_mla.flash_mla (FlashMLA's
interface: out and lse allocated every call, as FlashMLA's own does), to set beside FlashMLA's
figure for the same call: after its first call a metadata object replays its launch (the face's
launch cache), so this is the cached path; `..., checked path` alternates two caches of different
page strides (every call's key differs: the checked path, then the launch remembered), `..., first
call of a metadata` is a step's first layer (a new get_mla_metadata(): workspace, checked path
and the schedule kernel)."""

import ctypes
import json
import sys
import time

import torch

import dcp_mla
from dcp_mla import flash_mla, ops
from dcp_mla._fastlaunch import ops_key


def per_call_us(fn, reps=200, rounds=7):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
        torch.cuda.synchronize()
    return round(best * 1e6, 2)


def main():
    dev = torch.device("cuda")
    rows, b, h = 64, 8, 16
    oa, ob = torch.randn(rows, 512, device=dev), torch.randn(rows, 512, device=dev)
    la, lb = torch.randn(rows, device=dev), torch.randn(rows, device=dev)
    out, lse = torch.empty(rows, 512, device=dev), torch.empty(rows, device=dev)
    cache = torch.randn(b, 64, 576, device=dev).to(torch.bfloat16)
    table = torch.arange(b, dtype=torch.int32, device=dev).view(b, 1)
    q = torch.randn(b, 1, h, 576, device=dev).to(torch.bfloat16)
    lens = torch.full((b, 1), 64, dtype=torch.int32, device=dev)
    dout = torch.empty(b, 1, h, 512, dtype=torch.bfloat16, device=dev)
    dlse = torch.empty(b, 1, h, device=dev)
    splits, ws = dcp_mla.decode_workspace(q.shape, sparse=False, device=dev)
    scale = dcp_mla.default_scale()
    compute = dcp_mla._lib.SCHEDULE_COMPUTE
    scores = torch.randn(4, 4096, device=dev)
    slens = torch.full((4,), 4096, dtype=torch.int32, device=dev)
    idx = torch.empty(4, 512, dtype=torch.int32, device=dev)
    # the same tiny dense problem through the FlashMLA face: [pages, B, 1, 576], cache_seqlens [b]
    # (one schedule for every call, as a step's layers share it; the first call makes it)
    cache4, seqlens = cache.unsqueeze(2), lens.view(b)
    meta, _ = flash_mla.get_mla_metadata()
    # the same pages as a view of a wider page dimension: another page stride, another key
    paged = torch.randn(b, 65, 576, device=dev).to(torch.bfloat16)[:, :64].unsqueeze(2)
    caches_flip, meta_flip = [cache4, paged], flash_mla.get_mla_metadata()[0]

    def face_checked():
        caches_flip.reverse()
        return flash_mla.flash_mla_with_kvcache(q, caches_flip[0], table, seqlens, 512, meta_flip)

    cases = {
        "torch add_ (baseline)": lambda: out.add_(1.0),
        "merge_two": lambda: dcp_mla.merge_two(oa, la, ob, lb, out=out, lse=lse),
        "merge_two, outputs allocated": lambda: dcp_mla.merge_two(oa, la, ob, lb),
        "merge_two, C ABI call only": lambda: ops._merge_two(oa, la, ob, lb, 1, 1, out, lse, None),
        "decode_dense": lambda: dcp_mla.decode_dense(q, cache, table, lens, out=dout, lse=dlse, num_splits=splits,
                                                     workspace=ws),
        "decode_dense, C ABI call only": lambda: ops._decode_dense(q, cache, table, lens, dout, dlse, ws, scale, splits,
                                                                    compute, None, 0, 0, 1, 1, 0),
        "decode_dense, through torch.ops": lambda: torch.ops.dcp_mla.decode_dense(q, cache, table, lens, dout, dlse, ws,
                                                                                 scale, splits, compute, None, 0, 0, 1, 1, 0),
        "decode_dense, 1 split, C ABI call only": lambda: ops._decode_dense(q, cache, table, lens, dout, dlse, None,
                                                                             scale, 1, compute, None, 0, 0, 1, 1, 0),
        # the same launch through ctypes, the path every call took before the native launch (and
        # still takes where torch publishes no DLPack C exchange API)
        "decode_dense, 1 split, C ABI call only, ctypes path": lambda: ops._launch(
            ops._DENSE, ops._dev_stream(q), *ops._dense_values(q, cache, table, lens, dout, dlse, None, scale, 1, compute,
                                                             None, 0, 0, 1, 1, 0)),
        "topk_local": lambda: dcp_mla.topk_local(scores, slens, 512, out=idx),
        "flash_mla_with_kvcache face": lambda: flash_mla.flash_mla_with_kvcache(q, cache4, table, seqlens, 512, meta),
        "flash_mla_with_kvcache face, checked path": face_checked,
        "flash_mla_with_kvcache face, first call of a metadata": lambda: flash_mla.flash_mla_with_kvcache(
            q, cache4, table, seqlens, 512, flash_mla.get_mla_metadata()[0]),
        # the pieces of a call
        "piece: 6 tensor descriptors": lambda: [ops._t(x) for x in (q, dout, dlse, ws, cache, table)],
        "piece: device and raw stream": lambda: ops._dev_stream(q),
        "piece: argument checks of decode_dense": lambda: (ops._check(q, "q", (torch.bfloat16,), ndim=4),
                                                           ops._cache(cache), ops._check(table, "t", (torch.int32,), 2),
                                                           ops._check(lens, "l", (torch.int32,), 2),
                                                           ops._check(dout, "o", ops._OUT, 4),
                                                           ops._check(dlse, "s", (torch.float32,), 3)),
        "piece: ctypes call, no arguments": lambda: dcp_mla._lib.lib().dcp_mla_abi_version(),
    }
    # the launch cache's key of decode_dense's eight tensors, in Python (the ctypes path's) and native
    given = (q, dout, dlse, ws, cache, table, lens, None)
    cases["piece: key of decode_dense, Python"] = lambda: ops_key(given, (), 0)
    if ops._NATIVE is not None:
        # the native side's tensor reads and struct fill alone, no launch
        fill_buf = dcp_mla._lib.ARGS[ops._DENSE]()
        fill_at, fill_size = ctypes.addressof(fill_buf), ctypes.sizeof(fill_buf)
        cases["piece: native struct fill of decode_dense"] = lambda: ops._NATIVE.decode_dense(
            fill_at, fill_size, q, cache, table, lens, dout, dlse, None, None, scale, 1, compute, 0, 0, 1, 1, 0,
            stand_in=(0, 0))
        cases["piece: key of decode_dense, native"] = lambda: ops._NATIVE.tensor_key(given)
    report = {"splits": splits, "native_launch": ops._NATIVE is not None}
    report.update({name: per_call_us(fn) for name, fn in cases.items()})
    print(json.dumps(report, indent=1))
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
