"""Decode a transformers DeepSeek-V3 / V3.2 model (small random weights, the real attention sizes)
through dcp-mla's kernels under DCP simulated on one GPU, and print decode steps per second beside
transformers' own attention (eager and sdpa, its own KV cache) on the same model.

    PYTHONPATH=/tmp/dcp-py python3 python/examples/model_decode.py --model v3 v32 --dcp 1 2 4

Needs a CUDA GPU, torch, transformers (5.13 or later for V3.2) and the dcp_mla package. The engine is
mla_engine.py beside this file; python/tests/test_model_gpu.py checks it token for token.
"""

import argparse
import time

import torch

import mla_engine as me


def timed(fn, reps=1):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


def ours(model, prompts, steps, d, kv_format, nq):
    eng = me.MLAEngine(model, me.DcpMlaBackend(), batch=len(prompts), max_len=max(map(len, prompts)) + steps * nq + 8,
                       dcp_size=d, kv_format=kv_format)
    nxt = torch.stack([eng.prefill(k, p.tolist()).argmax() for k, p in enumerate(prompts)])
    tok = nxt.view(-1, 1).expand(-1, nq).contiguous()
    eng.decode(tok)  # warm-up (first launches, schedules)
    secs = timed(lambda: [eng.decode(tok) for _ in range(steps)])
    return steps / secs


def theirs(model, prompts, steps, impl):
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(impl)
    else:
        model.config._attn_implementation = impl
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long, device="cuda")
    mask = torch.zeros_like(ids)
    for k, p in enumerate(prompts):  # left padding
        ids[k, width - len(p):] = p.cuda()
        mask[k, width - len(p):] = 1

    def gen(n):
        model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                       eos_token_id=None, pad_token_id=0)
    gen(2)
    # prefill plus one token, against prefill plus `steps` + 1: the difference is `steps` decode steps
    return steps / (timed(lambda: gen(steps + 1)) - timed(lambda: gen(1)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", nargs="+", default=["v3", "v32"], choices=["v3", "v32"])
    ap.add_argument("--dcp", nargs="+", type=int, default=[1, 2, 4])
    ap.add_argument("--kv", nargs="+", default=["bf16", "fp8_656"], choices=["bf16", "fp8_656"])
    ap.add_argument("--prompts", nargs="+", type=int, default=[700, 600, 530, 300])
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--nq", type=int, default=1, help="query rows a step (MTP-style)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--topk", type=int, default=512)
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}; batch of {len(args.prompts)} prompts {args.prompts}, {args.steps} "
          f"decode steps, {args.layers} layers, {args.heads} heads, bf16 weights")
    print(f"| model | attention | D | KV cache | steps/s | ms/step |\n|---|---|---|---|---|---|")
    for kind in args.model:
        if kind == "v32" and not me.is_v32_available():
            print(f"| {kind} | (transformers has no DeepseekV32ForCausalLM) | | | | |")
            continue
        model = me.tiny_model(kind, device="cuda", dtype=torch.bfloat16, layers=args.layers, heads=args.heads,
                              index_topk=args.topk)
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=g).cuda() for n in args.prompts]
        with torch.no_grad():
            for impl in ("eager", "sdpa"):
                try:
                    sps = theirs(model, prompts, args.steps, impl)
                except Exception as e:  # an attention this transformers does not offer for the model
                    print(f"| {kind} | transformers {impl} | 1 | bf16 | ({type(e).__name__}) | |", flush=True)
                    continue
                print(f"| {kind} | transformers {impl} | 1 | bf16 (its own) | {sps:.1f} | {1000 / sps:.2f} |",
                      flush=True)
            if hasattr(model, "set_attn_implementation"):
                model.set_attn_implementation("eager")
            for fmt in args.kv:
                for d in args.dcp:
                    sps = ours(model, prompts, args.steps, d, fmt, args.nq)
                    print(f"| {kind} | dcp-mla | {d} | {fmt} | {sps:.1f} | {1000 / sps:.2f} |", flush=True)


if __name__ == "__main__":
    main()
