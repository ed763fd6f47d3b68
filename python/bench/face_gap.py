#!/usr/bin/env python3
"""Where the FlashMLA face's time goes in a captured step: the same dense decode, 4 layers a CUDA
graph replayed back to back (µs a layer, median of 15 replays), called five ways that differ in
one thing each, so that a gap between the face and the native call is pinned on its cause:

  face        dcp_mla.flash_mla.flash_mla_with_kvcache (cache_seqlens, lse [b, h, s_q] view, +inf)
  native      ops.decode_dense with the face's arguments (global lengths view, lse view, +inf)
  lse-plain   ... with a contiguous [b, s_q, h] lse and lse −inf for empty rows
  lens-local  ... and the rows' local lengths as a contiguous [b, s_q] tensor (LensRule::Local)
  compute     ... and every layer computing its split schedule (no reuse)

    PYTHONPATH=/tmp/dcp-py python3 python/bench/face_gap.py [OUT.json]

Needs torch and a GPU; prints one JSON line a shape. Block tables are random permutations of all
pages (as engines and FlashMLA's own benchmarks read them).
"""
import json
import sys

import torch

import dcp_mla
from dcp_mla import flash_mla as face
from dcp_mla import ops

LAYERS, PAGE = 4, 64
SHAPES = [(128, 1, 128, 8192, False), (128, 1, 64, 8192, False), (128, 2, 64, 8192, True), (64, 1, 16, 4096, False)]


def layer(b, s_q, h, s_k, g):
    pages = b * s_k // PAGE
    return dict(q=(torch.randn(b, s_q, h, 576, device="cuda", generator=g) / 4).to(torch.bfloat16),
                cache=(torch.randn(pages, PAGE, 1, 576, device="cuda", generator=g) / 4).to(torch.bfloat16),
                table=torch.randperm(pages, device="cuda", generator=g).to(torch.int32).view(b, -1),
                seqlens=torch.full((b,), s_k, dtype=torch.int32, device="cuda"))


def graph_us(step):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(15):
        a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        e.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(e) * 1000 / LAYERS)
    return sorted(ts)[len(ts) // 2]


def variants(layers, b, s_q, h, causal):
    rule = "global_causal" if causal else "global"
    local = ops.local_lens(layers[0]["seqlens"], dcp_size=1, interleave=1, rank=0, num_q=s_q, causal=causal)
    splits, ws = ops.decode_workspace((b, s_q, h, 576), sparse=False)

    def face_step():
        meta, _ = face.get_mla_metadata()
        for L in layers:
            face.flash_mla_with_kvcache(L["q"], L["cache"], L["table"], L["seqlens"], 512, meta, causal=causal)

    def native(lse_view, lens_local, reuse):
        def step():
            for i, L in enumerate(layers):
                lse = torch.empty((b, h, s_q), dtype=torch.float32, device="cuda")
                kw = dict(lse=lse.transpose(1, 2), empty_lse_inf=True) if lse_view else {}
                lens = local if lens_local else L["seqlens"]
                dcp_mla.decode_dense(L["q"], L["cache"], L["table"], lens, num_splits=splits, workspace=ws,
                                     reuse_schedule=reuse and i > 0, lens_rule="local" if lens_local else rule, **kw)
        return step

    return {"face": face_step, "native": native(True, False, True), "lse-plain": native(False, False, True),
            "lens-local": native(False, True, True), "compute": native(False, True, False)}


def main():
    rows = []
    for b, s_q, h, s_k, causal in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(b * 7 + h)
        layers = [layer(b, s_q, h, s_k, g) for _ in range(LAYERS)]
        r = {"shape": f"dense b{b} q{s_q} H{h} {s_k // 1024}K{' causal' if causal else ''}"}
        for name, step in variants(layers, b, s_q, h, causal).items():
            r[name] = round(graph_us(step), 1)
        rows.append(r)
        print(json.dumps(r), flush=True)
        del layers
        torch.cuda.empty_cache()
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
