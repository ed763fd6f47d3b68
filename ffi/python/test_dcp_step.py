"""A whole DCP decode step through the C ABI, D = 4 ranks simulated on one GPU, against plain
torch attention in float32.

Dense: KV fill on every rank (BF16 cache, permuted block table, NaN in unused slots), dense
decode of each rank's shard with MTP (q = 2) and split-KV, then both combine shapes: a2a (pack,
an all-to-all done with torch copies, combine; bf16 out) and ag_rs (correct, a reduce-scatter
done with a torch sum, finish; f32 out).
Sparse: FP8-656 cache, distributed top-k (local top-k, pack, all-gather, global merge, compact
with page translation), sparse decode per rank, a2a combine (f32 out); the merged ids must equal
torch.topk over all tokens.

Run: DCP_MLA_LIB=/path/to/libdcp_mla_ffi.so python3 ffi/python/test_dcp_step.py
The last line is PASS or FAIL with the error figures; the exit status is 0 on PASS.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dcp_mla  # noqa: E402

D, I, B = 4, 1, 64  # ranks, interleave, page size
H_L = 4  # heads per rank; H = D·H_L gathered heads
H = D * H_L
NQ = 2  # query rows per request (MTP)
DEV = torch.device("cuda")


def rel_l2(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def elementwise_ok(got, want, mean_abs_v):
    """docs/contract.md §9: |out - ref| <= 2^-6 * A_c elementwise (A_c: the softmax-weighted mean of |v|)."""
    return bool(((got - want).abs() <= mean_abs_v / 64).all().item())


def paged_layout(lens):
    """A shared block table with pages in a random order, and the pages per rank."""
    need = [-(-L // (B * D)) for L in lens]
    max_pages = max(need)
    perm = torch.randperm(sum(need)).tolist()
    table = torch.full((len(lens), max_pages), -1, dtype=torch.int32)
    k = 0
    for i, n in enumerate(need):
        table[i, :n] = torch.tensor(perm[k:k + n], dtype=torch.int32)
        k += n
    return table.to(DEV), sum(need)


def new_tokens(lens):
    """Every token of every request (fill writes the whole sequences): ckv, kpe, req_idx, pos."""
    total = sum(lens)
    ckv = torch.randn(total, 512, device=DEV).to(torch.bfloat16)
    kpe = torch.randn(total, 64, device=DEV).to(torch.bfloat16)
    req = torch.cat([torch.full((L,), i, dtype=torch.int32) for i, L in enumerate(lens)]).to(DEV)
    pos = torch.cat([torch.arange(L, dtype=torch.int32) for L in lens]).to(DEV)
    return ckv, kpe, req, pos


def attention(q_row, keys, scale):
    """q_row [H, 576], keys [n, 576] float32 -> out [H, 512], lse [H] (natural log), and A [H, 512]
    (the softmax-weighted mean of |v|, which docs/contract.md §9's elementwise bound is relative to)."""
    s = scale * (q_row.float() @ keys.float().T)  # [H, n]
    lse = torch.logsumexp(s, dim=1)
    p = torch.softmax(s, dim=1)
    v = keys[:, :512].float()
    return p @ v, lse, p @ v.abs()


def a2a(m, outs, lses, T, out_dtype):
    """The a2a combine: pack on every rank, an all-to-all by copies, combine on every rank."""
    slot = m.a2a_slot_bytes(T, H_L)
    sends = []
    for r in range(D):
        send = torch.empty(D, slot, dtype=torch.uint8, device=DEV)
        m.a2a_pack(outs[r].view(T, H, 512), lses[r].view(T, H), send, slot_bytes=slot, num_tokens=T,
                   local_heads=H_L, dcp_size=D)
        sends.append(send)
    full_out, full_lse = [], []
    for d in range(D):
        recv = torch.stack([sends[r][d] for r in range(D)])
        out = torch.empty(T, H_L, 512, dtype=out_dtype, device=DEV)
        lse = torch.empty(T, H_L, dtype=torch.float32, device=DEV)
        m.a2a_combine(recv, out, lse, slot_bytes=slot, lse_base=dcp_mla.LSE_BASE_E, num_tokens=T,
                      local_heads=H_L, dcp_size=D)
        full_out.append(out)
        full_lse.append(lse)
    return torch.cat(full_out, dim=1), torch.cat(full_lse, dim=1)


def ag_rs(m, outs, lses, T):
    """The ag_rs combine: all-gathered lse, per-rank correction, reduce-scatter by a sum, finish."""
    lse_all = torch.stack([l.view(T, H) for l in lses]).contiguous()
    contribs = []
    for r in range(D):
        c = torch.empty(H, T, 512, dtype=torch.float32, device=DEV)
        m.ag_rs_correct(outs[r].view(T, H, 512), lse_all, c, lse_base=dcp_mla.LSE_BASE_E, num_tokens=T,
                        local_heads=H_L, dcp_size=D, rank=r)
        contribs.append(c)
    full_out, full_lse = [], []
    for d in range(D):
        summed = sum(c[d * H_L:(d + 1) * H_L] for c in contribs).contiguous()
        out = torch.empty(T, H_L, 512, dtype=torch.float32, device=DEV)
        lse = torch.empty(T, H_L, dtype=torch.float32, device=DEV)
        m.ag_rs_finish(summed, lse_all, out, lse, lse_base=dcp_mla.LSE_BASE_E, num_tokens=T, local_heads=H_L,
                       dcp_size=D, rank=d)
        full_out.append(out)
        full_lse.append(lse)
    return torch.cat(full_out, dim=1), torch.cat(full_lse, dim=1)


def dense_step(m, num_sms):
    lens = [300, 77, 2, 1000]
    b = len(lens)
    T = b * NQ
    table, pages = paged_layout(lens)
    ckv, kpe, req, pos = new_tokens(lens)
    q = torch.randn(b, NQ, H, 576, device=DEV).to(torch.bfloat16)
    scale = m.default_scale()
    splits = m.decode_num_splits(b, NQ, H, False, num_sms)
    ws = torch.empty(max(m.decode_workspace_bytes(b, NQ, H, False, splits), 16), dtype=torch.uint8, device=DEV)
    outs, lses = [], []
    for r in range(D):
        cache = torch.full((pages, B, 576), float("nan"), dtype=torch.bfloat16, device=DEV)
        m.kv_fill(ckv, kpe, req, pos, table, cache, fmt=dcp_mla.KV_BF16, dcp_size=D, interleave=I, rank=r)
        rl = torch.tensor(m.causal_local_lens(lens, [NQ] * b, D, I, r), dtype=torch.int32, device=DEV)
        out = torch.full((b, NQ, H, 512), float("nan"), dtype=torch.float32, device=DEV)
        lse = torch.full((b, NQ, H), float("nan"), dtype=torch.float32, device=DEV)
        m.decode_dense(q, cache, table, rl.view(b, NQ), out, lse, scale=scale, num_splits=splits, workspace=ws)
        outs.append(out)
        lses.append(lse)
    a2a_out, a2a_lse = a2a(m, outs, lses, T, torch.bfloat16)
    ag_out, ag_lse = ag_rs(m, outs, lses, T)

    ref_out = torch.empty(T, H, 512, device=DEV)
    ref_abs = torch.empty(T, H, 512, device=DEV)
    ref_lse = torch.empty(T, H, device=DEV)
    keys = torch.cat([ckv, kpe], dim=1)
    start = 0
    for i, L in enumerate(lens):
        for j in range(NQ):
            c = L - NQ + 1 + j
            o, s, a = attention(q[i, j], keys[start:start + c], scale)
            ref_out[i * NQ + j], ref_lse[i * NQ + j], ref_abs[i * NQ + j] = o, s, a
        start += L
    torch.cuda.synchronize()
    res = {
        "dense_a2a_bf16_rel_l2": rel_l2(a2a_out.float(), ref_out),
        "dense_a2a_max_abs": (a2a_out.float() - ref_out).abs().max().item(),
        "dense_ag_rs_f32_rel_l2": rel_l2(ag_out, ref_out),
        "dense_ag_rs_max_abs": (ag_out - ref_out).abs().max().item(),
        "dense_lse_max_abs": max((a2a_lse - ref_lse).abs().max().item(), (ag_lse - ref_lse).abs().max().item()),
    }
    ok = (res["dense_a2a_bf16_rel_l2"] <= 3e-3 and elementwise_ok(a2a_out.float(), ref_out, ref_abs)
          and res["dense_ag_rs_f32_rel_l2"] <= 3e-3 and elementwise_ok(ag_out, ref_out, ref_abs)
          and res["dense_lse_max_abs"] <= 1e-4)
    return ok, res


def dequant_fp8(cache):
    """[pages, B, 656] uint8 -> [pages, B, 576] float32 (e4m3 · group scale | bf16 k_pe)."""
    vals = cache[..., :512].contiguous().view(torch.float8_e4m3fn).float()
    scales = cache[..., 512:528].contiguous().view(torch.float32)  # [pages, B, 4]
    kpe = cache[..., 528:656].contiguous().view(torch.bfloat16).float()
    return torch.cat([vals * scales.repeat_interleave(128, dim=-1), kpe], dim=-1)


def sparse_step(m, num_sms):
    K = 512
    m.check_topk(D, K)
    lens = [3000, 1500]
    b = len(lens)
    rows = b * NQ
    table, pages = paged_layout(lens)
    ckv, kpe, req, pos = new_tokens(lens)
    q = torch.randn(b, NQ, H, 576, device=DEV).to(torch.bfloat16)
    scale = m.default_scale()
    lmax = max(lens)
    scores = torch.randn(rows, lmax, device=DEV)  # the indexer's score of every global token
    caches = []
    for r in range(D):
        cache = torch.full((pages, B, 656), 0x7F, dtype=torch.uint8, device=DEV)  # e4m3 NaN bytes
        m.kv_fill(ckv, kpe, req, pos, table, cache, fmt=dcp_mla.KV_FP8_656, dcp_size=D, interleave=I, rank=r)
        caches.append(cache)

    # Distributed top-k: each rank sees the scores of its own tokens (global = local·D + r for I = 1).
    cand_scores = torch.empty(D, rows, K, dtype=torch.float32, device=DEV)
    cand_ids = torch.empty(D, rows, K, dtype=torch.int32, device=DEV)
    for r in range(D):
        cols = m.local_len(lmax, D, I, r)
        local_scores = scores[:, r::D][:, :cols].contiguous()
        rl = torch.tensor(m.causal_local_lens(lens, [NQ] * b, D, I, r), dtype=torch.int32, device=DEV)
        local_idx = torch.empty(rows, K, dtype=torch.int32, device=DEV)
        m.topk_local(local_scores, rl, local_idx, k=K)
        m.topk_pack(local_idx, local_scores, cand_scores[r], cand_ids[r], dcp_size=D, interleave=I, rank=r)
    ids = torch.empty(rows, K, dtype=torch.int32, device=DEV)
    m.topk_merge(cand_scores, cand_ids, ids)

    splits = m.decode_num_splits(b, NQ, H, True, num_sms)
    ws = torch.empty(max(m.decode_workspace_bytes(b, NQ, H, True, splits), 16), dtype=torch.uint8, device=DEV)
    outs, lses = [], []
    for r in range(D):
        slots = torch.empty(rows, K, dtype=torch.int32, device=DEV)
        counts = torch.empty(rows, dtype=torch.int32, device=DEV)
        m.topk_compact(ids, slots, counts, dcp_size=D, interleave=I, rank=r, block_table=table, block_size=B,
                       rows_per_request=NQ)
        out = torch.full((b, NQ, H, 512), float("nan"), dtype=torch.float32, device=DEV)
        lse = torch.full((b, NQ, H), float("nan"), dtype=torch.float32, device=DEV)
        m.decode_sparse(q, caches[r], dcp_mla.KV_FP8_656, slots.view(b, NQ, K), out, lse, scale=scale,
                        topk_len=counts.view(b, NQ), num_splits=splits, workspace=ws)
        outs.append(out)
        lses.append(lse)
    out, lse = a2a(m, outs, lses, rows, torch.float32)

    # Reference: torch.topk over all of a row's causal tokens, attention over the dequantised cache.
    deq = [dequant_fp8(c) for c in caches]
    ref_out = torch.empty(rows, H, 512, device=DEV)
    ref_abs = torch.empty(rows, H, 512, device=DEV)
    ref_lse = torch.empty(rows, H, device=DEV)
    topk_mismatch = 0
    fp8_err = 0.0
    start = 0
    for i, L in enumerate(lens):
        g = torch.arange(L, device=DEV)
        local = g // D
        page = table[i].long()[local // B]
        keys = torch.stack([deq[r][page, local % B] for r in range(D)])[g % D, g]  # [L, 576]
        fp8_err = max(fp8_err, rel_l2(keys[:, :512], ckv[start:start + L].float()))
        for j in range(NQ):
            row = i * NQ + j
            c = L - NQ + 1 + j
            want = torch.topk(scores[row, :c], min(K, c)).indices.sort().values
            got = ids[row][ids[row] >= 0].long().sort().values
            if got.shape != want.shape or not torch.equal(got, want):
                topk_mismatch += 1
            o, s, a = attention(q[i, j], keys[want], scale)
            ref_out[row], ref_lse[row], ref_abs[row] = o, s, a
        start += L
    torch.cuda.synchronize()
    res = {
        "sparse_topk_rows_mismatched": topk_mismatch,
        "sparse_fp8_dequant_rel_l2": fp8_err,
        "sparse_rel_l2": rel_l2(out, ref_out),
        "sparse_max_abs": (out - ref_out).abs().max().item(),
        "sparse_lse_max_abs": (lse - ref_lse).abs().max().item(),
    }
    ok = (topk_mismatch == 0 and fp8_err <= 0.06 and res["sparse_rel_l2"] <= 3e-3
          and elementwise_ok(out, ref_out, ref_abs) and res["sparse_lse_max_abs"] <= 1e-4)
    return ok, res


def main():
    torch.manual_seed(int(os.environ.get("DCP_MLA_SEED", "0")))
    m = dcp_mla.DcpMla(0)
    major, minor, num_sms = m.device_info()
    print(f"dcp-mla {m.version()} on sm_{major}{minor}, {num_sms} SMs, {len(m.variants())} variants, D = {D}")
    results, ok = {}, True
    for step in (dense_step, sparse_step):
        try:
            step_ok, res = step(m, num_sms)
        except Exception as e:  # a failure of one step still reports the other
            step_ok, res = False, {step.__name__ + "_error": repr(e)}
        ok &= step_ok
        results.update(res)
        print(step.__name__, "ok" if step_ok else "FAILED", res)
    m.close()
    figures = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in results.items())
    print(("PASS" if ok else "FAIL") + ": " + figures)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
