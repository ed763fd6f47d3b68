#!/usr/bin/env python3
"""Where a captured decode step's time goes, kernel by kernel: the same layers (4 a CUDA graph, as
the engine view builds them) replayed through FlashMLA (when its package is given), the FlashMLA face
and the native `decode_dense` call, under torch's profiler. For each, per layer: the replay's wall
time (CUDA events), the kernels' summed device time, the gaps between them, and each kernel's
name and median duration. A face-against-native difference then shows as longer kernels (the
data or the launch's arguments) or as longer gaps (the graph's launches).

    PYTHONPATH=/tmp/dcp-py python3 python/bench/decode_profile.py [--flashmla DIR] [--shapes I,J] [--power]
        [--alternate] [OUT.json]

--alternate: instead of the profile, each library's captured step timed as the engine view times
it (15 replays) after a COOL_S pause, in ALT_ROUNDS rounds whose order rotates: the card's power
cap lowers the clock within ~0.1-0.5 s of back-to-back replays, so whichever graph runs right after
another pays for the other's heat (docs/performance.md, "The power state"); alternating with pauses
gives each library the same card.

DIR holds FlashMLA's package `flash_mla/` with its built extension. Needs torch and a GPU.
"""
import json
import statistics
import subprocess
import sys
import time

import torch

import dcp_mla
from dcp_mla import flash_mla as face
from dcp_mla import ops

LAYERS, PAGE, REPLAYS = 4, 64, 20
SWEEP = False  # --sweep: b = 64 q = 1 over growing contexts, and the native call unsplit beside
POWER = False  # --power: also time 2 s of back-to-back replays beside nvidia-smi's clock and power
ALTERNATE = False  # --alternate: cool, rotated rounds of the engine view's timing instead of the profile
ALT_ROUNDS, COOL_S = 3, 2.0
# (b, s_q, h, s_k, causal, topk): topk > 0 is sparse FP8-656 over a context of s_k tokens a request
SHAPES = [(64, 1, 16, 4096, False, 0), (128, 1, 128, 8192, False, 0), (32, 2, 128, 16384, True, 0),
          (128, 1, 64, 8192, False, 0), (64, 1, 128, 8192, False, 512), (128, 1, 64, 32768, False, 2048)]


def sparse_layer(b, s_q, h, s_k, topk, g):
    """FP8-656 rows (512 e4m3 latent values, four fp32 scales of 1, 64 bf16 rope values) and
    distinct random tokens of each request through a shuffled page order."""
    pages = b * s_k // PAGE
    kv = torch.empty(b * s_k, 656, dtype=torch.uint8, device="cuda")
    kv[:, :512] = (torch.randn(b * s_k, 512, device="cuda", generator=g) / 2).to(torch.float8_e4m3fn).view(torch.uint8)
    kv[:, 512:528] = torch.ones(1, 4, dtype=torch.float32, device="cuda").view(torch.uint8)
    kv[:, 528:] = torch.randn(b * s_k, 64, device="cuda", generator=g).to(torch.bfloat16).view(torch.uint8)
    table = torch.randperm(pages, device="cuda", generator=g).view(b, -1)
    tok = torch.rand(b * s_q, s_k, device="cuda", generator=g).topk(topk, dim=-1).indices.view(b, s_q, topk)
    idx = (table[torch.arange(b, device="cuda").view(b, 1, 1), tok // PAGE] * PAGE + tok % PAGE).to(torch.int32)
    return dict(q=(torch.randn(b, s_q, h, 576, device="cuda", generator=g) / 4).to(torch.bfloat16),
                cache=kv.view(pages, PAGE, 1, 656).view(torch.float8_e4m3fn), indices=idx.contiguous())


def layer(b, s_q, h, s_k, g):
    pages = b * s_k // PAGE
    return dict(q=(torch.randn(b, s_q, h, 576, device="cuda", generator=g) / 4).to(torch.bfloat16),
                cache=(torch.randn(pages, PAGE, 1, 576, device="cuda", generator=g) / 4).to(torch.bfloat16),
                table=torch.randperm(pages, device="cuda", generator=g).to(torch.int32).view(b, -1),
                seqlens=torch.full((b,), s_k, dtype=torch.int32, device="cuda"))


def capture(step):
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
    return g


def wall_us(g):
    ts = []
    for _ in range(15):
        a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        e.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(e) * 1000 / LAYERS)
    return statistics.median(ts)


def kernel_profile(g):
    """Per replay: the kernels in launch order (name, start µs, duration µs)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            g.replay()
            torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type.name == "CUDA" and "Memcpy" not in e.name and "Memset" not in e.name]
    evs.sort(key=lambda e: e.time_range.start)
    per = len(evs) // REPLAYS
    replays = [evs[i * per:(i + 1) * per] for i in range(REPLAYS)] if per else []
    return per, replays


def sustained(g, seconds=2.0):
    """Replays back to back for `seconds` while nvidia-smi samples the SM clock and the board's
    power: (µs a layer, median MHz, median W). A kernel whose on-chip work outlasts its memory
    stream slows where the power cap lowers the clock; one that streams does not."""
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "100"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    n, t0 = 0, time.perf_counter()
    a = torch.cuda.Event(enable_timing=True)
    e = torch.cuda.Event(enable_timing=True)
    a.record()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            g.replay()
        n += 20
        torch.cuda.synchronize()
    e.record()
    torch.cuda.synchronize()
    smi.terminate()
    samples = []
    for line in smi.stdout.read().splitlines():
        try:
            mhz, w = (float(x) for x in line.split(","))
            samples.append((mhz, w))
        except ValueError:
            pass
    us = a.elapsed_time(e) * 1000 / (n * LAYERS)
    mhz = statistics.median(x[0] for x in samples) if samples else None
    w = statistics.median(x[1] for x in samples) if samples else None
    return round(us, 1), mhz, w


def alternate(steps):
    """{name: [µs a layer, one a round]} of each step's graph, timed as wall_us after a COOL_S
    pause, the order rotated by one each round; with "ratio": FlashMLA's median / the face's."""
    graphs = {name: capture(step) for name, step in steps.items()}
    names = list(graphs)
    out = {name: [] for name in names}
    for r in range(ALT_ROUNDS):
        for name in names[r % len(names):] + names[:r % len(names)]:
            time.sleep(COOL_S)
            out[name].append(round(wall_us(graphs[name]), 1))
    if "flashmla" in out and "face" in out:
        out["ratio"] = round(statistics.median(out["flashmla"]) / statistics.median(out["face"]), 3)
    return out


def summarise(g):
    wall = wall_us(g)
    per, replays = kernel_profile(g)
    busy, span, durs = [], [], None
    for r in replays:
        t0, t1 = r[0].time_range.start, r[-1].time_range.end
        busy.append(sum(e.time_range.elapsed_us() for e in r) / LAYERS)
        span.append((t1 - t0) / LAYERS)
        if durs is None:
            durs = [[e.name[:60]] for e in r]
        for d, e in zip(durs, r):
            d.append(e.time_range.elapsed_us())
    kernels = [(d[0], round(statistics.median(d[1:]), 1)) for d in (durs or [])]
    out = {}
    if POWER:
        out["sustained_us"], out["sm_mhz"], out["power_w"] = sustained(g)
    return dict(**out, wall_us=round(wall, 1), kernels_per_replay=per, busy_us=round(statistics.median(busy), 1) if busy else None,
                span_us=round(statistics.median(span), 1) if span else None,
                kernels=kernels[: per // LAYERS + 2] if per >= LAYERS else kernels)


def sparse_row(fmla, layers, b, s_q, h, topk):
    """Sparse FP8: the face and FlashMLA (the native call is the face's one launch here)."""
    def step_of(mod):
        def step():
            meta, _ = mod.get_mla_metadata()
            for L in layers:
                mod.flash_mla_with_kvcache(L["q"], L["cache"], None, None, 512, meta, is_fp8_kvcache=True,
                                           indices=L["indices"])
        return step
    r = {"shape": f"sparse fp8 b{b} q{s_q} H{h} K{topk}"}
    if ALTERNATE:
        steps = {"face": step_of(face)}
        if fmla is not None:
            steps = {"flashmla": step_of(fmla), **steps}
        r.update(alternate(steps))
        return r
    if fmla is not None:
        r["flashmla"] = summarise(capture(step_of(fmla)))
    r["face"] = summarise(capture(step_of(face)))
    return r


def main():
    args = sys.argv[1:]
    fmla = None
    if "--flashmla" in args:
        i = args.index("--flashmla")
        sys.path.insert(0, args[i + 1])
        import flash_mla as fmla  # noqa: F401
        del args[i:i + 2]
    global POWER, SWEEP, ALTERNATE
    if "--alternate" in args:
        ALTERNATE = True
        args.remove("--alternate")
    if "--power" in args:
        POWER = True
        args.remove("--power")
    if "--sweep" in args:
        # the dense decode kernel's fixed cost and rate: b = 64 q = 1 at growing contexts, each
        # library's decode kernel alone (median over the layers and replays)
        args.remove("--sweep")
        SWEEP = True
        SHAPES[:] = [(64, 1, h, s_k, False, 0) for h in (16, 64) for s_k in (1024, 2048, 4096, 8192, 16384)]
    pick = None
    if "--shapes" in args:
        i = args.index("--shapes")
        pick = {int(x) for x in args[i + 1].split(",")}
        del args[i:i + 2]
    rows = []
    for si, (b, s_q, h, s_k, causal, topk) in enumerate(SHAPES):
        if pick is not None and si not in pick:
            continue
        g0 = torch.Generator(device="cuda").manual_seed(b * 7 + h)
        if topk:
            layers = [sparse_layer(b, s_q, h, s_k, topk, g0) for _ in range(LAYERS)]
            rows.append(sparse_row(fmla, layers, b, s_q, h, topk))
            print(json.dumps(rows[-1]), flush=True)
            del layers
            torch.cuda.empty_cache()
            continue
        layers = [layer(b, s_q, h, s_k, g0) for _ in range(LAYERS)]
        splits, ws = ops.decode_workspace((b, s_q, h, 576), sparse=False, context=s_k, causal=causal)
        rule = "global_causal" if causal else "global"

        def face_step():
            meta, _ = face.get_mla_metadata()
            for L in layers:
                face.flash_mla_with_kvcache(L["q"], L["cache"], L["table"], L["seqlens"], 512, meta, causal=causal)

        def native_step():
            for i, L in enumerate(layers):
                lse = torch.empty((b, h, s_q), dtype=torch.float32, device="cuda")
                dcp_mla.decode_dense(L["q"], L["cache"], L["table"], L["seqlens"], num_splits=splits, workspace=ws,
                                     reuse_schedule=i > 0, lens_rule=rule, lse=lse.transpose(1, 2), empty_lse_inf=True)

        def unsplit_step():
            for L in layers:
                lse = torch.empty((b, h, s_q), dtype=torch.float32, device="cuda")
                dcp_mla.decode_dense(L["q"], L["cache"], L["table"], L["seqlens"], num_splits=1, lens_rule=rule,
                                     lse=lse.transpose(1, 2), empty_lse_inf=True)

        steps = {"face": face_step, "native": native_step}
        if SWEEP:
            steps["unsplit"] = unsplit_step
        if fmla is not None:
            def fmla_step():
                meta, _ = fmla.get_mla_metadata()
                for L in layers:
                    fmla.flash_mla_with_kvcache(L["q"], L["cache"], L["table"], L["seqlens"], 512, meta, causal=causal)
            steps = {"flashmla": fmla_step, **steps}
        r = {"shape": f"dense b{b} q{s_q} H{h} {s_k // 1024}K{' causal' if causal else ''}", "splits": splits}
        if ALTERNATE:
            r.update(alternate(steps))
        else:
            for name, step in steps.items():
                r[name] = summarise(capture(step))
        rows.append(r)
        print(json.dumps(r), flush=True)
        del layers
        torch.cuda.empty_cache()
    if args:
        with open(args[0], "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
