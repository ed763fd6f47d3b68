"""The package on a GPU: every operation against torch references written from docs/semantics.md,
a whole D = 4 decode step simulated on one GPU (dense BF16, and sparse FP8 with the distributed
top-k), torch.compile(fullgraph=True) of a step, CUDA-graph capture and replay with changed
lengths, the FlashMLA face against the native functions (python/bench/launch_overhead.py measures the Python overhead),
and MODEL1 (FlashMLA's d_qk = 512 path: its fill, its two-source decode and the face's
extra_k_cache / topk_length) against a float64 torch reference written from docs/contract.md.
Each test takes the `dev` fixture (conftest.py): skipped without a GPU, failed when
DCP_MLA_REQUIRE_GPU=1."""

import math
import os

import pytest

torch = pytest.importorskip("torch") if os.environ.get("DCP_MLA_REQUIRE_GPU") != "1" else __import__("torch")

import dcp_mla  # noqa: E402
from dcp_mla import DcpMlaError  # noqa: E402
from dcp_mla.flash_mla import flash_mla_with_kvcache, get_mla_metadata  # noqa: E402

INF = float("inf")


# --- torch references (docs/semantics.md) --------------------------------------------------------

def owner(t, d, i):
    return (t // i) % d


def local_pos(t, d, i):
    return (t // (d * i)) * i + t % i


def rel_l2(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def within_contract(got, want, mean_abs_v):
    """docs/contract.md §9: |out − ref| ≤ 2^-6·A_c elementwise and relative L2 ≤ 3e-3."""
    return bool(((got - want).abs() <= mean_abs_v / 64 + 1e-6).all().item()) and rel_l2(got, want) <= 3e-3


def attention(q_row, keys, scale):
    """q_row [H, 576], keys [n, 576] → out [H, 512], lse [H] (natural log), A [H, 512] in float64.
    No key: out 0, lse −inf."""
    if keys.shape[0] == 0:
        h = q_row.shape[0]
        z = torch.zeros(h, 512, dtype=torch.float64, device=q_row.device)
        return z, torch.full((h,), -INF, dtype=torch.float64, device=q_row.device), z
    s = scale * (q_row.double() @ keys.double().T)
    p = torch.softmax(s, dim=1)
    v = keys[:, :512].double()
    return p @ v, torch.logsumexp(s, dim=1), p @ v.abs()


def paged_table(lens, d, b, dev, spare=0):
    """A block table with the pages of every request in a random order; the pages per rank."""
    need = [-(-n // (b * d)) for n in lens]
    width = max(max(need), 1) + spare
    perm = torch.randperm(sum(need)).tolist()
    table = torch.full((len(lens), width), -1, dtype=torch.int32)
    k = 0
    for i, n in enumerate(need):
        table[i, :n] = torch.tensor(perm[k:k + n], dtype=torch.int32)
        k += n
    return table.to(dev), max(sum(need), 1)


def tokens(lens, dev):
    total = sum(lens)
    ckv = torch.randn(total, 512, device=dev).to(torch.bfloat16)
    kpe = torch.randn(total, 64, device=dev).to(torch.bfloat16)
    req = torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(lens)]).to(dev)
    pos = torch.cat([torch.arange(n, dtype=torch.int32) for n in lens]).to(dev)
    return ckv, kpe, req, pos


def filled_caches(lens, d, i, b, fmt, dev):
    table, pages = paged_table(lens, d, b, dev)
    ckv, kpe, req, pos = tokens(lens, dev)
    caches = []
    for r in range(d):
        if fmt == "bf16":
            cache = torch.full((pages, b, 576), float("nan"), dtype=torch.bfloat16, device=dev)
        else:
            cache = torch.full((pages, b, 656), 0x7F, dtype=torch.uint8, device=dev)  # e4m3 NaN bytes
        dcp_mla.kv_fill(ckv, kpe, req, pos, table, cache, dcp_size=d, interleave=i, rank=r, kv_format=fmt)
        caches.append(cache)
    return table, caches, torch.cat([ckv, kpe], dim=1)


def dequant_fp8(cache):
    vals = cache[..., :512].contiguous().view(torch.float8_e4m3fn).float()
    scales = cache[..., 512:528].contiguous().view(torch.float32)
    kpe = cache[..., 528:656].contiguous().view(torch.bfloat16).float()
    return torch.cat([vals * scales.repeat_interleave(128, dim=-1), kpe], dim=-1)


def cache_rows(caches, table, req, lens_req, d, i, b, deq=None):
    """The 576 values of every token of request `req` as stored on its owner rank."""
    g = torch.arange(lens_req, device=table.device)
    local = (g // (d * i)) * i + g % i
    page = table[req].long()[local // b]
    src = deq if deq is not None else [c.float() for c in caches]
    stacked = torch.stack([src[r][page, local % b] for r in range(d)])
    return stacked[(g // i) % d, torch.arange(lens_req, device=table.device)]


# --- one operation at a time ---------------------------------------------------------------------

@pytest.mark.parametrize("d,i,b", [(1, 1, 64), (2, 2, 16), (4, 1, 64)])
def test_kv_fill_bf16_places_every_token_on_its_owner(dev, d, i, b):
    lens = [5, 130, 0, 64]
    table, caches, keys = filled_caches(lens, d, i, b, "bf16", dev)
    start = 0
    for req, n in enumerate(lens):
        for t in range(n):
            r = owner(t, d, i)
            lp = local_pos(t, d, i)
            row = caches[r][table[req, lp // b].item(), lp % b]
            assert torch.equal(row, keys[start + t]), (req, t)
        start += n
    written = sum(int((~torch.isnan(c.float())).all(dim=-1).sum()) for c in caches)
    assert written == sum(lens), "a token was written to a rank that does not own it"


def test_kv_fill_fp8_is_within_e4m3_rounding(dev):
    lens, d, i, b = [300, 17], 2, 1, 64
    table, caches, keys = filled_caches(lens, d, i, b, "fp8_656", dev)
    deq = [dequant_fp8(c) for c in caches]
    start = 0
    for req, n in enumerate(lens):
        got = cache_rows(caches, table, req, n, d, i, b, deq)
        assert torch.equal(got[:, 512:], keys[start:start + n, 512:].float()), "k_pe is stored as bf16"
        assert rel_l2(got[:, :512], keys[start:start + n, :512].float()) <= 0.06
        start += n


@pytest.mark.parametrize("out_dtype,splits", [(torch.float32, None), (torch.bfloat16, 1), (torch.float32, 1)])
def test_decode_dense_matches_attention(dev, out_dtype, splits):
    lens, nq, h, b = [1000, 0, 77, 3], 2, 16, 64
    table, caches, keys = filled_caches(lens, 1, 1, b, "bf16", dev)
    q = torch.randn(len(lens), nq, h, 576, device=dev).to(torch.bfloat16)
    rl = torch.tensor([[max(n - nq + 1 + j, 0) for j in range(nq)] for n in lens], dtype=torch.int32, device=dev)
    out, lse = dcp_mla.decode_dense(q, caches[0], table, rl, num_splits=splits, out_dtype=out_dtype)
    assert out.dtype == out_dtype and out.shape == (len(lens), nq, h, 512) and lse.shape == (len(lens), nq, h)
    scale = dcp_mla.default_scale()
    start = 0
    for req, n in enumerate(lens):
        for j in range(nq):
            o, s, a = attention(q[req, j], keys[start:start + rl[req, j].item()], scale)
            assert within_contract(out[req, j].double(), o, a), (req, j)
            if rl[req, j] == 0:
                assert torch.all(out[req, j] == 0) and torch.all(lse[req, j] == -INF)
            else:
                assert (lse[req, j].double() - s).abs().max().item() <= 1e-5 + 2e-6 * s.abs().max().item()
        start += n


def sinks_for(h, dev):
    """One attention sink per head covering the contract's cases: −inf (out unchanged), +inf (out
    0), NaN (out NaN where the row reads tokens) and finite values around the rows' lse."""
    sink = torch.randn(h, device=dev) * 2
    sink[0::8], sink[3::8], sink[5::8] = -INF, INF, float("nan")
    return sink


def sinked(out, lse, sink):
    """FlashMLA's attn_sink on a result without one: out · e^lse / (e^lse + e^sink) per head (rows
    [.., H]), in float64; 0 where the row saw no token."""
    l, s = lse.double(), sink.double()
    f = torch.where(l > s, 1 / (1 + torch.exp(s - l)), torch.exp(l - s) / (torch.exp(l - s) + 1))
    f = torch.where(torch.isinf(l), torch.zeros_like(f), f)
    return out.double() * f[..., None]


def close_with_nans(got, want, tol):
    nan = torch.isnan(want)
    return torch.equal(torch.isnan(got), nan) and (got.double() - want).abs()[~nan].max().item() <= tol


@pytest.mark.parametrize("splits", [1, None, 5])
def test_decode_sinks_scale_out_and_keep_lse(dev, splits):
    # dense and sparse FP8, unsplit and split (a split row takes its sink in the combine): out is
    # the sinkless out scaled per head, lse is unchanged, an empty row stays 0
    lens, nq, h, b = [900, 0, 70], 2, 64, 64
    table, caches, _ = filled_caches(lens, 1, 1, b, "bf16", dev)
    q = torch.randn(len(lens), nq, h, 576, device=dev).to(torch.bfloat16)
    rl = torch.tensor([[max(n - nq + 1 + j, 0) for j in range(nq)] for n in lens], dtype=torch.int32, device=dev)
    sink = sinks_for(h, dev)
    out, lse = dcp_mla.decode_dense(q, caches[0], table, rl, num_splits=splits, out_dtype=torch.float32)
    out_s, lse_s = dcp_mla.decode_dense(q, caches[0], table, rl, num_splits=splits, out_dtype=torch.float32,
                                        sink=sink)
    assert torch.equal(lse_s, lse)
    assert close_with_nans(out_s, sinked(out, lse, sink), 2e-6 * out.abs().max().item())
    assert torch.all(out_s[1] == 0), "an empty request's rows stay 0 whatever the sink"
    table8, caches8, _ = filled_caches(lens, 1, 1, b, "fp8_656", dev)
    idx = torch.full((len(lens), nq, 512), -1, dtype=torch.int32, device=dev)
    toks = torch.arange(500, device=dev)  # request 0's first 500 tokens, as page·B + slot
    idx[0, :, :500] = (table8[0].long()[toks // b] * b + toks % b).int()
    out, lse = dcp_mla.decode_sparse(q, caches8[0], idx, num_splits=splits, out_dtype=torch.float32)
    out_s, lse_s = dcp_mla.decode_sparse(q, caches8[0], idx, num_splits=splits, out_dtype=torch.float32, sink=sink)
    assert torch.equal(lse_s, lse)
    assert close_with_nans(out_s, sinked(out, lse, sink), 2e-6 * out.abs().max().item())
    assert torch.all(out_s[1:] == 0)
    with pytest.raises(ValueError, match="sink"):
        dcp_mla.decode_dense(q, caches[0], table, rl, sink=sink[:h - 1])


def test_combine_sinks_apply_once(dev):
    # merge_two (rows [T, H], H sinks), ag_rs_finish and a2a_combine (H_l sinks of the rank's heads)
    t, h = 40, 8
    oa, ob = torch.randn(t * h, 512, device=dev), torch.randn(t * h, 512, device=dev)
    la, lb = torch.randn(t * h, device=dev) * 4, torch.randn(t * h, device=dev) * 4
    la[:h], lb[:h] = -INF, -INF  # token 0: empty on both sides
    sink = sinks_for(h, dev)
    out, lse = dcp_mla.merge_two(oa, la, ob, lb)
    out_s, lse_s = dcp_mla.merge_two(oa, la, ob, lb, sink=sink)
    assert torch.equal(lse_s, lse) and torch.all(out_s[:h] == 0)
    assert close_with_nans(out_s, sinked(out.view(t, h, 512), lse.view(t, h), sink).view(t * h, 512), 1e-5)
    with pytest.raises(ValueError, match="sink"):
        dcp_mla.merge_two(oa, la, ob, lb, sink=sink[:3])
    d, hl = 4, 8
    outs = torch.randn(t, d * hl, 512, device=dev).to(torch.bfloat16)
    lses = torch.randn(d, t, d * hl, device=dev) * 3
    summed = torch.randn(hl, t, 512, device=dev)
    out, lse = dcp_mla.ag_rs_finish(summed, lses, dcp_size=d, rank=1, out_dtype=torch.float32)
    out_s, lse_s = dcp_mla.ag_rs_finish(summed, lses, dcp_size=d, rank=1, out_dtype=torch.float32, sink=sink)
    assert torch.equal(lse_s, lse) and close_with_nans(out_s, sinked(out, lse, sink), 1e-5)
    send = dcp_mla.a2a_pack(outs, lses[0], dcp_size=d)
    recv = torch.stack([send[0]] * d)  # every source's slot for rank 0: the merge of d equal slots
    out, lse = dcp_mla.a2a_combine(recv, num_tokens=t, local_heads=hl, out_dtype=torch.float32)
    out_s, lse_s = dcp_mla.a2a_combine(recv, num_tokens=t, local_heads=hl, out_dtype=torch.float32, sink=sink)
    assert torch.equal(lse_s, lse) and close_with_nans(out_s, sinked(out, lse, sink), 1e-5)


def test_decode_dense_reuses_a_schedule_exactly(dev):
    # a step's first layer computes the split schedule, the others reuse it: with the lengths it
    # was made for the result is bit for bit the computing call's, with other lengths (longer,
    # shorter, empty) it is still the attention of the new lengths
    lens, nq, h, b = [1000, 0, 77, 3], 1, 16, 64
    table, caches, keys = filled_caches(lens, 1, 1, b, "bf16", dev)
    q = torch.randn(len(lens), nq, h, 576, device=dev).to(torch.bfloat16)
    splits, ws = dcp_mla.decode_workspace(q.shape, sparse=False, num_splits=7, device=dev)
    first = torch.tensor([[300], [0], [77], [3]], dtype=torch.int32, device=dev)
    out0, lse0 = dcp_mla.decode_dense(q, caches[0], table, first, num_splits=splits, workspace=ws)
    out1, lse1 = dcp_mla.decode_dense(q, caches[0], table, first, num_splits=splits, workspace=ws,
                                      reuse_schedule=True)
    assert torch.equal(out0, out1) and torch.equal(lse0, lse1)
    other = torch.tensor([[1000], [0], [5], [0]], dtype=torch.int32, device=dev)
    out, lse = dcp_mla.decode_dense(q, caches[0], table, other, num_splits=splits, workspace=ws,
                                    reuse_schedule=True, out_dtype=torch.float32)
    scale = dcp_mla.default_scale()
    start = 0
    for req, n in enumerate(lens):
        o, s, a = attention(q[req, 0], keys[start:start + other[req, 0].item()], scale)
        assert within_contract(out[req, 0].double(), o, a), req
        if other[req, 0] == 0:
            assert torch.all(out[req, 0] == 0) and torch.all(lse[req, 0] == -INF)
        else:
            assert (lse[req, 0].double() - s).abs().max().item() <= 1e-5 + 2e-6 * s.abs().max().item()
        start += n
    with pytest.raises(ValueError, match="workspace"):
        dcp_mla.decode_dense(q, caches[0], table, first, num_splits=splits, reuse_schedule=True)


def test_decode_sparse_bf16_reads_listed_rows(dev):
    lens, nq, h, b, k = [700, 40], 1, 32, 64, 512
    table, caches, keys = filled_caches(lens, 1, 1, b, "bf16", dev)
    q = torch.randn(len(lens), nq, h, 576, device=dev).to(torch.bfloat16)
    indices = torch.full((len(lens), nq, k), -1, dtype=torch.int32, device=dev)
    chosen = []
    for req, n in enumerate(lens):
        toks = torch.randperm(n)[:min(n, 300)].to(dev)
        slots = table[req].long()[toks // b] * b + toks % b
        indices[req, 0, :toks.numel()] = slots.int()
        chosen.append(toks)
    topk_len = torch.tensor([[200], [40]], dtype=torch.int32, device=dev)
    out, lse = dcp_mla.decode_sparse(q, caches[0], indices, topk_len=topk_len, kv_format="bf16")
    scale = dcp_mla.default_scale()
    start = 0
    for req, n in enumerate(lens):
        use = chosen[req][:topk_len[req, 0].item()]
        o, s, a = attention(q[req, 0], keys[start + use], scale)
        assert within_contract(out[req, 0].double(), o, a), req
        start += n


@pytest.mark.parametrize("base_a,base_b", [("e", "e"), ("e", "2"), ("2", "2")])
def test_merge_two_matches_the_formula(dev, base_a, base_b):
    rows = 300
    oa, ob = torch.randn(rows, 512, device=dev), torch.randn(rows, 512, device=dev)
    la, lb = torch.randn(rows, device=dev) * 4, torch.randn(rows, device=dev) * 4
    la[:7], lb[3:10] = -INF, -INF  # empty inputs; rows 3..6 empty on both sides
    out, lse = dcp_mla.merge_two(oa, la, ob, lb, lse_a_base=base_a, lse_b_base=base_b)
    na = la.double() * (math.log(2) if base_a == "2" else 1)
    nb = lb.double() * (math.log(2) if base_b == "2" else 1)
    m = torch.maximum(na, nb)
    wa = torch.where(na == -INF, 0, torch.exp(na - m))
    wb = torch.where(nb == -INF, 0, torch.exp(nb - m))
    s = wa + wb
    want = torch.where((s > 0)[:, None], (wa[:, None] * oa.double() + wb[:, None] * ob.double()) / s.clamp_min(1e-300)[:, None], 0)
    want_lse = torch.where(s > 0, m + torch.log(s.clamp_min(1e-300)), -INF)
    assert (out.double() - want).abs().max().item() <= 1e-5
    assert torch.equal(lse[3:7], torch.full((4,), -INF, device=dev))
    ok = want_lse > -INF
    assert (lse.double()[ok] - want_lse[ok]).abs().max().item() <= 1e-5
    # in place: out is out_a
    out2, _ = dcp_mla.merge_two(oa, la, ob, lb, lse_a_base=base_a, lse_b_base=base_b, out=oa)
    assert out2 is oa and torch.equal(oa, out)


def test_merge_two_takes_bf16_inputs(dev):
    # bf16 in (as attention writes it): the same merge as on the inputs widened to f32, and by
    # default a bf16 result (the f32 result rounded to nearest even)
    rows = 300
    oa, ob = torch.randn(rows, 512, device=dev).bfloat16(), torch.randn(rows, 512, device=dev).bfloat16()
    la, lb = torch.randn(rows, device=dev) * 4, torch.randn(rows, device=dev) * 4
    la[:7] = -INF
    wide, wide_lse = dcp_mla.merge_two(oa.float(), la, ob.float(), lb, lse_b_base="2")
    out, lse = dcp_mla.merge_two(oa, la, ob, lb, lse_b_base="2")
    assert out.dtype == torch.bfloat16 and torch.equal(out, wide.bfloat16())
    assert torch.equal(lse, wide_lse)
    out32, _ = dcp_mla.merge_two(oa, la, ob, lb, lse_b_base="2", out_dtype=torch.float32)
    assert torch.equal(out32, wide)
    with pytest.raises(Exception, match="out_b"):
        dcp_mla.merge_two(oa, la, ob.float(), lb)


@pytest.mark.parametrize("k", [256, 2048])
def test_topk_local_is_the_exact_top_k(dev, k):
    rows, cols = 6, 5000
    scores = torch.randn(rows, cols + 17, device=dev)
    scores[1, :] = 0.5  # all ties: the lowest indices win
    lens = torch.tensor([5000, 4000, 100, 0, k, 2500], dtype=torch.int32, device=dev)
    idx = dcp_mla.topk_local(scores, lens, k, cols=cols)
    for r in range(rows):
        n = lens[r].item()
        got = idx[r]
        if n <= k:  # every index, then −1
            want = torch.cat([torch.arange(n, device=dev), torch.full((k - n,), -1, device=dev)]).int()
        elif r == 1:  # all tied: the lowest indices win
            want = torch.arange(k, dtype=torch.int32, device=dev)
        else:
            want = torch.topk(scores[r, :n], k).indices.sort().values.int()
        assert torch.equal(got, want), r


def test_topk_compact_keeps_own_ids_in_order(dev):
    d, i, b, rows, k = 4, 1, 64, 4, 512
    ids = torch.full((rows, k), -1, dtype=torch.int32, device=dev)
    for r in range(rows):
        n = [512, 300, 0, 5][r]
        ids[r, :n] = torch.randperm(20000)[:n].sort().values.int().to(dev)
    for rank in range(d):
        out, counts = dcp_mla.topk_compact(ids, dcp_size=d, interleave=i, rank=rank)
        for r in range(rows):
            mine = [v for v in ids[r].tolist() if v >= 0 and owner(v, d, i) == rank]
            assert counts[r].item() == len(mine)
            assert out[r].tolist() == [local_pos(v, d, i) for v in mine] + [-1] * (k - len(mine))


def test_prefill_flatten_and_reorder_rebuild_every_prefix(dev):
    d, i, b = 2, 1, 16
    lens = [100, 0, 333]
    table, caches, keys = filled_caches(lens, d, i, b, "bf16", dev)
    budget = 1 << 24
    pp = dcp_mla.prefill_plan(lens, d, i, b, budget)
    starts = [sum(lens[:r]) for r in range(len(lens))]
    seen = 0
    for c in range(pp.num_chunks):
        table_rows = dcp_mla.prefill_piece_table(lens, d, i, b, budget, c)
        pieces = torch.tensor(table_rows, dtype=torch.int32, device=dev).view(-1, 8)
        gathered = torch.stack([
            dcp_mla.prefill_flatten(caches[r], table, pieces,
                                    torch.full((pp.cap_rows, 576), 7.0, dtype=torch.bfloat16, device=dev),
                                    dcp_size=d, interleave=i, rank=r) for r in range(d)])
        out = torch.full((pp.chunk_tokens, 576), float("nan"), dtype=torch.bfloat16, device=dev)
        dcp_mla.prefill_reorder(gathered, pieces, out, dcp_size=d, interleave=i)
        for req, local_start, _row_off, _rows, glen, out_off, _, _ in table_rows:
            if glen == 0:
                continue
            gstart = local_start * d
            assert torch.equal(out[out_off:out_off + glen], keys[starts[req] + gstart:starts[req] + gstart + glen])
            seen += glen
    assert seen == sum(lens)


def test_local_lens_on_device_match_the_planner(dev):
    seqlens = torch.tensor([0, 1, 5, 64, 1000, 4097], dtype=torch.int32, device=dev)
    for d, i in [(1, 1), (4, 1), (2, 8)]:
        for nq, causal in [(1, True), (3, True), (3, False)]:
            for r in range(d):
                got = dcp_mla.local_lens(seqlens, dcp_size=d, interleave=i, rank=r, num_q=nq, causal=causal)
                for req, n in enumerate(seqlens.tolist()):
                    for j in range(nq):
                        seen = max(n - nq + 1 + j, 0) if causal else n
                        assert got[req, j].item() == dcp_mla.local_len(seen, d, i, r)


def test_argument_errors_name_the_argument(dev):
    table, caches, _ = filled_caches([100], 1, 1, 64, "bf16", dev)
    q = torch.randn(1, 1, 16, 576, device=dev).to(torch.bfloat16)
    lens = torch.tensor([[100]], dtype=torch.int32, device=dev)
    with pytest.raises(TypeError, match="^q: dtype torch.float32"):
        dcp_mla.decode_dense(q.float(), caches[0], table, lens)
    with pytest.raises(ValueError, match="^lens: shape"):
        dcp_mla.decode_dense(q, caches[0], table, lens.view(1, 1, 1)[0, :, :].expand(1, 2))
    with pytest.raises(ValueError, match="^lens: on cpu"):
        dcp_mla.decode_dense(q, caches[0], table, lens.cpu())
    with pytest.raises(ValueError, match="^q: last dim must have stride 1"):
        dcp_mla.decode_dense(torch.randn(1, 1, 16, 1152, device=dev).to(torch.bfloat16)[..., ::2],
                             caches[0], table, lens)
    # a view is taken as it is, but its rows must start 16-byte aligned: a head stride of 580
    with pytest.raises(DcpMlaError, match=r"`q\.strides`") as e:
        dcp_mla.decode_dense(torch.randn(1, 1, 16, 580, device=dev).to(torch.bfloat16)[..., :576],
                             caches[0], table, lens)
    assert e.value.status == "MISALIGNED"
    with pytest.raises(ValueError, match="^cache: dense decode reads a bf16 cache"):
        dcp_mla.decode_dense(q, torch.zeros(4, 64, 656, dtype=torch.uint8, device=dev), table, lens)
    with pytest.raises(ValueError, match="^workspace: 16 bytes"):
        dcp_mla.decode_dense(q, caches[0], table, lens, num_splits=8,
                             workspace=torch.empty(16, dtype=torch.uint8, device=dev))
    with pytest.raises(ValueError, match="^cache: holds bf16 rows"):
        dcp_mla.decode_sparse(q, caches[0], torch.zeros(1, 1, 512, dtype=torch.int32, device=dev),
                              kv_format="fp8_656")
    # what only the C ABI can see: a k the kernels do not have
    with pytest.raises(DcpMlaError) as e:
        dcp_mla.topk_local(torch.randn(2, 100, device=dev), torch.tensor([100, 100], dtype=torch.int32, device=dev),
                           300)
    assert e.value.status in ("INVALID_ARGUMENT", "INVALID_CONFIG", "UNSUPPORTED") and "300" in e.value.message
    with pytest.raises(DcpMlaError) as e:  # D·K not a multiple of 512
        dcp_mla.topk_merge(torch.zeros(1, 2, 256, device=dev), torch.zeros(1, 2, 256, dtype=torch.int32, device=dev))
    assert e.value.status == "INVALID_CONFIG"


# --- a whole DCP step, D = 4 on one GPU ----------------------------------------------------------

D, I, B, H_L, NQ = 4, 1, 64, 4, 2
H = D * H_L


def a2a(outs, lses, t, out_dtype):
    sends = [dcp_mla.a2a_pack(outs[r].view(t, H, 512), lses[r].view(t, H), dcp_size=D) for r in range(D)]
    full = [dcp_mla.a2a_combine(torch.stack([sends[r][d] for r in range(D)]), num_tokens=t, local_heads=H_L,
                                out_dtype=out_dtype) for d in range(D)]
    return torch.cat([o for o, _ in full], dim=1), torch.cat([l for _, l in full], dim=1)


def ag_rs(outs, lses, t):
    lse_all = torch.stack([l.view(t, H) for l in lses]).contiguous()
    contribs = [dcp_mla.ag_rs_correct(outs[r].view(t, H, 512), lse_all, dcp_size=D, rank=r) for r in range(D)]
    full = [dcp_mla.ag_rs_finish(sum(c[d * H_L:(d + 1) * H_L] for c in contribs).contiguous(), lse_all, dcp_size=D,
                                 rank=d, out_dtype=torch.float32) for d in range(D)]
    return torch.cat([o for o, _ in full], dim=1), torch.cat([l for _, l in full], dim=1)


def test_ag_rs_bf16_contribution_is_the_f32_one_rounded(dev):
    # a bf16 contribution (for a bf16 reduce-scatter) is the f32 one rounded to nearest even, and
    # the finish takes the bf16 sum
    t = 40
    outs = torch.randn(t, H, 512, device=dev).bfloat16()
    lse_all = (torch.randn(D, t, H, device=dev) * 4).contiguous()
    lse_all[1, :5] = -INF
    wide = dcp_mla.ag_rs_correct(outs, lse_all, dcp_size=D, rank=1)
    half = dcp_mla.ag_rs_correct(outs, lse_all, dcp_size=D, rank=1, contrib_dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16 and torch.equal(half, wide.bfloat16())
    summed = half[H_L:2 * H_L].contiguous()
    out, lse = dcp_mla.ag_rs_finish(summed, lse_all, dcp_size=D, rank=1, out_dtype=torch.float32)
    out_w, lse_w = dcp_mla.ag_rs_finish(summed.float(), lse_all, dcp_size=D, rank=1, out_dtype=torch.float32)
    assert torch.equal(out, out_w) and torch.equal(lse, lse_w)


def dense_rank_decode(q, caches, table, seqlens, num_splits=None, workspaces=None):
    """Every rank's partial decode of the step: local lengths on the device, then decode."""
    outs, lses = [], []
    for r in range(D):
        rl = dcp_mla.local_lens(seqlens, dcp_size=D, interleave=I, rank=r, num_q=NQ)
        o, l = dcp_mla.decode_dense(q, caches[r], table, rl, out_dtype=torch.float32, num_splits=num_splits,
                                    workspace=None if workspaces is None else workspaces[r])
        outs.append(o)
        lses.append(l)
    return outs, lses


def dense_reference(q, keys, lens):
    t = len(lens) * NQ
    ref = torch.empty(t, H, 512, dtype=torch.float64, device=q.device)
    ref_abs = torch.empty_like(ref)
    ref_lse = torch.empty(t, H, dtype=torch.float64, device=q.device)
    scale, start = dcp_mla.default_scale(), 0
    for i, n in enumerate(lens):
        for j in range(NQ):
            o, s, a = attention(q[i, j], keys[start:start + n - NQ + 1 + j], scale)
            ref[i * NQ + j], ref_lse[i * NQ + j], ref_abs[i * NQ + j] = o, s, a
        start += n
    return ref, ref_lse, ref_abs


def dense_step_inputs(lens, dev):
    """A dense step's inputs: every rank's filled bf16 cache, the shared table, every token's
    576 values, q [b, NQ, H, 576] and the lengths on the device."""
    table, caches, keys = filled_caches(lens, D, I, B, "bf16", dev)
    q = torch.randn(len(lens), NQ, H, 576, device=dev).to(torch.bfloat16)
    return table, caches, keys, q, torch.tensor(lens, dtype=torch.int32, device=dev)


def test_dcp_step_dense(dev):
    lens = [300, 77, 2, 1000]
    table, caches, keys, q, seqlens = dense_step_inputs(lens, dev)
    outs, lses = dense_rank_decode(q, caches, table, seqlens)
    t = len(lens) * NQ
    ref, ref_lse, ref_abs = dense_reference(q, keys, lens)
    for name, (out, lse) in {"a2a": a2a(outs, lses, t, torch.bfloat16), "ag_rs": ag_rs(outs, lses, t)}.items():
        assert within_contract(out.double(), ref, ref_abs), name
        assert (lse.double() - ref_lse).abs().max().item() <= 1e-4, name


def test_dcp_step_sparse_fp8_with_distributed_topk(dev):
    k, lens = 512, [3000, 1500]
    dcp_mla.check_topk(D, k)
    b, rows = len(lens), len(lens) * NQ
    table, caches, _ = filled_caches(lens, D, I, B, "fp8_656", dev)
    q = torch.randn(b, NQ, H, 576, device=dev).to(torch.bfloat16)
    lmax = max(lens)
    scores = torch.randn(rows, lmax, device=dev)
    cand_scores = torch.empty(D, rows, k, device=dev)
    cand_ids = torch.empty(D, rows, k, dtype=torch.int32, device=dev)
    for r in range(D):
        cols = dcp_mla.local_len(lmax, D, I, r)
        local = scores[:, r::D][:, :cols].contiguous()
        rl = torch.tensor(dcp_mla.causal_local_lens(lens, [NQ] * b, D, I, r), dtype=torch.int32, device=dev)
        idx = dcp_mla.topk_local(local, rl, k)
        dcp_mla.topk_pack(idx, local, dcp_size=D, interleave=I, rank=r, cand_scores=cand_scores[r],
                          cand_ids=cand_ids[r])
    ids = dcp_mla.topk_merge(cand_scores, cand_ids)
    outs, lses = [], []
    for r in range(D):
        slots, counts = dcp_mla.topk_compact(ids, dcp_size=D, interleave=I, rank=r, block_table=table, block_size=B,
                                             rows_per_request=NQ)
        o, l = dcp_mla.decode_sparse(q, caches[r], slots.view(b, NQ, k), topk_len=counts.view(b, NQ),
                                     kv_format="fp8_656", out_dtype=torch.float32)
        outs.append(o)
        lses.append(l)
    out, lse = a2a(outs, lses, rows, torch.float32)
    deq = [dequant_fp8(c) for c in caches]
    scale = dcp_mla.default_scale()
    for i, n in enumerate(lens):
        keys = cache_rows(caches, table, i, n, D, I, B, deq)
        for j in range(NQ):
            row = i * NQ + j
            c = n - NQ + 1 + j
            want = torch.topk(scores[row, :c], min(k, c)).indices.sort().values
            got = ids[row][ids[row] >= 0].long().sort().values
            assert torch.equal(got, want), row
            o, s, a = attention(q[i, j], keys[want], scale)
            assert within_contract(out[row].double(), o, a), row
            assert (lse[row].double() - s).abs().max().item() <= 1e-4


def test_compiled_step_matches_eager(dev):
    lens = [300, 77, 2, 1000]
    table, caches, _, q, seqlens = dense_step_inputs(lens, dev)
    t = len(lens) * NQ

    def step(q, seqlens, c0, c1, c2, c3, table):
        outs, lses = dense_rank_decode(q, [c0, c1, c2, c3], table, seqlens)
        return a2a(outs, lses, t, torch.bfloat16)

    eager = step(q, seqlens, *caches, table)
    compiled = torch.compile(step, fullgraph=True)(q, seqlens, *caches, table)
    torch.cuda.synchronize()
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])


def test_graph_replay_with_changed_lengths(dev):
    lens = [900, 500, 64, 1000]
    table, caches, keys, q, seqlens = dense_step_inputs(lens, dev)
    t = len(lens) * NQ
    shape_splits, _ = dcp_mla.decode_workspace(q.shape, sparse=False, device=dev)
    workspaces = [dcp_mla.decode_workspace(q.shape, sparse=False, device=dev)[1] for _ in range(D)]

    def step():
        outs, lses = dense_rank_decode(q, caches, table, seqlens, shape_splits, workspaces)
        return a2a(outs, lses, t, torch.bfloat16)

    step()  # warm up outside the capture (first launches load nothing lazily, but torch may)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = step()
    for new_lens in ([900, 500, 64, 1000], [17, 3, 64, 999], [2, 2, 2, 2]):
        seqlens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        eager = step()
        assert torch.equal(out, eager[0]) and torch.equal(lse, eager[1]), new_lens
        ref, ref_lse, ref_abs = dense_reference(q, keys_of(keys, lens, new_lens), new_lens)
        assert within_contract(out.double(), ref, ref_abs), new_lens


def keys_of(keys, full_lens, new_lens):
    """The keys of requests truncated to new_lens (the cache still holds the full ones)."""
    parts, start = [], 0
    for n, m in zip(full_lens, new_lens):
        parts.append(keys[start:start + m])
        start += n
    return torch.cat(parts)


# --- the FlashMLA face ---------------------------------------------------------------------------

def test_flash_mla_face_dense_matches_native(dev):
    lens, s_q, h = [700, 1, 65], 2, 32
    table, caches, _ = filled_caches(lens, 1, 1, B, "bf16", dev)
    q = torch.randn(len(lens), s_q, h, 576, device=dev).to(torch.bfloat16)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=dev)
    meta, splits = get_mla_metadata(seqlens, s_q * h, 1)
    k_cache = caches[0].view(caches[0].shape[0], B, 1, 576)
    out, lse = flash_mla_with_kvcache(q, k_cache, table, seqlens, 512, meta, splits, causal=True)
    # the native call with the face's lengths rule: the same launch class (causal), so the same
    # kernel and split count from the tuned table, hence the same bits; the local lengths of the
    # same rows (a non-causal class, which a table may send elsewhere) agree within the contract
    nout, nlse = dcp_mla.decode_dense(q, caches[0], table, seqlens, lens_rule="global_causal")
    assert out.shape == (len(lens), s_q, h, 512) and lse.shape == (len(lens), h, s_q)
    assert torch.equal(out, nout)
    rl = dcp_mla.local_lens(seqlens, dcp_size=1, interleave=1, rank=0, num_q=s_q)
    lout, llse = dcp_mla.decode_dense(q, caches[0], table, rl)
    torch.testing.assert_close(lout.float(), out.float(), atol=2e-2, rtol=2e-2)
    assert torch.equal(torch.isinf(llse), torch.isinf(nlse))
    torch.testing.assert_close(torch.nan_to_num(llse, neginf=0.0), torch.nan_to_num(nlse, neginf=0.0), atol=1e-4, rtol=1e-4)
    nl = nlse.transpose(1, 2)
    assert torch.equal(lse, torch.where(nl == -INF, INF, nl)), "FlashMLA's lse: [b, h, s_q], +inf for empty rows"
    assert torch.isinf(lse[1, :, 0]).all() and (lse[1, :, 0] > 0).all(), "request 1's first causal row sees nothing"
    # the second call with the same metadata (a step's next layer) reuses its schedule
    assert meta.scheduled
    out2, lse2 = flash_mla_with_kvcache(q, k_cache, table, seqlens, 512, meta, splits, causal=True)
    assert torch.equal(out2, out) and torch.equal(lse2, lse)
    # a first call that raises before its launch leaves the schedule to the next call
    fresh = get_mla_metadata()[0]
    with pytest.raises(ValueError, match="topk_length"):
        flash_mla_with_kvcache(q, k_cache, table, seqlens, 512, fresh, None, causal=True, topk_length=seqlens)
    assert fresh.have_initialized and not fresh.scheduled
    out3, _ = flash_mla_with_kvcache(q, k_cache, table, seqlens, 512, fresh, None, causal=True)
    assert torch.equal(out3, out)
    with pytest.raises(ValueError, match="tile_scheduler_metadata"):
        flash_mla_with_kvcache(q[:2], k_cache, table[:2], seqlens[:2], 512, meta, None, causal=True)
    # attn_sink: FlashMLA's per-head sink, lse unchanged
    sink = sinks_for(h, dev)
    out_s, lse_s = flash_mla_with_kvcache(q, k_cache, table, seqlens, 512, get_mla_metadata()[0], None, causal=True,
                                          attn_sink=sink)
    nout_s, _ = dcp_mla.decode_dense(q, caches[0], table, seqlens, sink=sink, lens_rule="global_causal")
    # bit for bit: the NaN sinks make NaN rows, and NaN != NaN under torch.equal
    assert torch.equal(out_s.view(torch.int16), nout_s.view(torch.int16)) and torch.equal(lse_s, lse)


def sparse_face_problem(dev, k, topk_length):
    """Two requests (2,000 and 300 tokens) of an FP8-656 cache, H 64, q 1, each query row's top-k
    (k entries, -1 past the request's tokens) as cache rows: q, the cache, FlashMLA's view of it
    [pages, B, 1, 656], the indices, topk_length and the requests' block table."""
    lens, h = [2000, 300], 64
    table, caches, _ = filled_caches(lens, 1, 1, B, "fp8_656", dev)
    q = torch.randn(len(lens), 1, h, 576, device=dev).to(torch.bfloat16)
    indices = torch.full((len(lens), 1, k), -1, dtype=torch.int32, device=dev)
    for req, n in enumerate(lens):
        toks = torch.randperm(n)[:min(n, k)].to(dev)
        indices[req, 0, :toks.numel()] = (table[req].long()[toks // B] * B + toks % B).int()
    k_cache = caches[0].view(torch.float8_e4m3fn).view(caches[0].shape[0], B, 1, 656)
    return q, caches[0], k_cache, indices, torch.tensor(topk_length, dtype=torch.int32, device=dev), table


def test_flash_mla_face_sparse_fp8_matches_native(dev):
    q, cache, k_cache, indices, topk_length, _ = sparse_face_problem(dev, 2048, [1500, 300])
    out, lse = flash_mla_with_kvcache(q, k_cache, None, None, 512, get_mla_metadata()[0], None,
                                      is_fp8_kvcache=True, indices=indices, topk_length=topk_length)
    nout, nlse = dcp_mla.decode_sparse(q, cache, indices, topk_len=topk_length.view(-1, 1), kv_format="fp8_656")
    assert torch.equal(out, nout) and torch.equal(lse, nlse.transpose(1, 2))


def checked_launches(monkeypatch):
    """Counts the face's calls that take the checked path (into ops.decode_dense/decode_sparse);
    a call its launch cache replays goes straight to the C ABI."""
    from dcp_mla import flash_mla as face_module
    calls = []
    for name in ("decode_dense", "decode_sparse"):
        # the name bound now (a closure would see the loop's last name)
        def counted(*args, _real=getattr(face_module.ops, name), _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)
        monkeypatch.setattr(face_module.ops, name, counted)
    return calls


@pytest.mark.parametrize("path", ["native", "ctypes"])
def test_flash_mla_face_launch_cache_dense(dev, monkeypatch, path):
    if path == "ctypes":  # the launch cache keyed and replayed through ctypes (else natively)
        from dcp_mla import ops
        monkeypatch.setattr(ops, "_NATIVE", None)
    else:
        native_launch_or_fail()
    lens, s_q, h = [700, 1, 65], 2, 32
    table, caches, _ = filled_caches(lens, 1, 1, B, "bf16", dev)
    args = dict(q=torch.randn(len(lens), s_q, h, 576, device=dev).to(torch.bfloat16),
                k_cache=caches[0].view(caches[0].shape[0], B, 1, 576), block_table=table,
                cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=dev), attn_sink=torch.randn(h, device=dev))
    checked = checked_launches(monkeypatch)

    def face(meta, **change):
        a = dict(args, **change)
        return flash_mla_with_kvcache(a.pop("q"), a.pop("k_cache"), a.pop("block_table"), a.pop("cache_seqlens"),
                                      512, meta, None, causal=True, **a)

    def same(got, want):
        return torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

    meta = get_mla_metadata()[0]
    first = face(meta)
    assert checked == ["decode_dense"] and meta.launch is not None
    second = face(meta)
    assert len(checked) == 1, "the same arguments again: replayed"
    assert second[0].data_ptr() != first[0].data_ptr() and second[1].data_ptr() != first[1].data_ptr()
    assert same(second, first) and same(face(get_mla_metadata()[0]), first), "bit for bit the checked call's"
    n = len(checked)
    # a data pointer that moves (another cache, a block_table copy, ...) is written into the replay:
    # the original is overwritten first, so a launch that read it would differ
    for name, scramble in [("q", 0.0), ("k_cache", 0.0), ("block_table", 0), ("cache_seqlens", 1),
                           ("attn_sink", 0.0)]:
        original = args[name]
        copy = original.clone()
        assert copy.stride() == original.stride() and copy.data_ptr() != original.data_ptr()
        original.fill_(scramble)
        assert same(face(meta, **{name: copy}), first), name
        original.copy_(copy)
    assert len(checked) == n, "pointers alone change: every call replayed"
    # new values behind the same pointers are read, as by any launch
    q2, saved = torch.randn_like(args["q"]), args["q"].clone()
    want = face(get_mla_metadata()[0], q=q2)
    n = len(checked)
    args["q"].copy_(q2)
    assert same(face(meta), want) and len(checked) == n
    args["q"].copy_(saved)

    def reference(**change):
        """The changed call on a metadata of the original call's split count and schedule."""
        m = get_mla_metadata()[0]
        face(m)
        return face(m, **change)
    # a stride, a shape, a dtype, a scalar or the stream that changes takes the checked path
    paged = paged_view(caches[0]).unsqueeze(2)
    wider = torch.cat([table, torch.full((len(lens), 1), -1, dtype=torch.int32, device=dev)], dim=1)
    for change in [dict(k_cache=paged), dict(block_table=wider), dict(cache_seqlens=args["cache_seqlens"].long()),
                   dict(softmax_scale=0.05), dict(attn_sink=None)]:
        n = len(checked)
        got = face(meta, **change)
        assert len(checked) == n + 1, change.keys()
        assert same(got, reference(**change)), change.keys()
    # (int64 lengths are converted each call: such a call is never remembered)
    n = len(checked)
    face(meta, cache_seqlens=args["cache_seqlens"].long())
    face(meta, cache_seqlens=args["cache_seqlens"].long())
    assert len(checked) == n + 2
    n = len(checked)
    face(meta, attn_sink=None)
    assert len(checked) == n, "the last remembered call replays"
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        n = len(checked)
        on_side = face(meta)
        assert len(checked) == n + 1, "another stream: checked"
        face(meta)
        assert len(checked) == n + 1, "then replayed on it"
    torch.cuda.current_stream().wait_stream(side)
    assert same(on_side, first)
    # another thread takes the checked path (each thread replays only its own launches)
    import threading
    n = len(checked)
    face(meta)
    face(meta)
    assert len(checked) == n + 1, "the default stream again: checked, then replayed"
    res = []
    worker = threading.Thread(target=lambda: res.append(face(meta)))
    worker.start()
    worker.join()
    torch.cuda.synchronize()
    assert len(checked) == n + 2 and same(res[0], first)
    face(meta)
    assert len(checked) == n + 3, "the other thread's launch is not replayed here"
    # the checks of the checked path still run: another shape raises as before
    with pytest.raises(ValueError, match="tile_scheduler_metadata"):
        face(meta, q=args["q"][:2], block_table=table[:2], cache_seqlens=args["cache_seqlens"][:2])
    with pytest.raises(ValueError, match="topk_length"):
        face(meta, topk_length=args["cache_seqlens"])


@pytest.mark.parametrize("path", ["native", "ctypes"])
def test_flash_mla_face_launch_cache_sparse(dev, monkeypatch, path):
    if path == "ctypes":  # the launch cache keyed and replayed through ctypes (else natively)
        from dcp_mla import ops
        monkeypatch.setattr(ops, "_NATIVE", None)
    else:
        native_launch_or_fail()
    q, _, k_cache, indices, topk_length, table = sparse_face_problem(dev, 512, [400, 300])
    checked = checked_launches(monkeypatch)

    def face(meta, q=q, indices=indices, topk_length=topk_length, block_table=None, cache_seqlens=None):
        return flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512, meta, None, is_fp8_kvcache=True,
                                      indices=indices, topk_length=topk_length)

    meta = get_mla_metadata()[0]
    out, lse = face(meta)
    out2, lse2 = face(meta)
    assert checked == ["decode_sparse"]
    assert torch.equal(out2, out) and torch.equal(lse2, lse)
    for name, x, scramble in [("indices", indices, -1), ("topk_length", topk_length, 0)]:
        copy = x.clone()
        x.fill_(scramble)
        got = face(meta, **{name: copy})
        assert torch.equal(got[0], out) and torch.equal(got[1], lse), name
        x.copy_(copy)
    assert len(checked) == 1
    # a block table or lengths given to sparse decode are not read: no part of the key
    face(meta, block_table=table, cache_seqlens=topk_length)
    assert len(checked) == 1
    got = face(meta, indices=view_of_larger(indices))
    assert len(checked) == 2 and torch.equal(got[0], out) and torch.equal(got[1], lse)


def test_flash_mla_face_launch_cache_in_a_graph(dev, monkeypatch):
    # a step's layers captured in one graph: the first call on the capture stream is checked, the
    # others replay it; the graph reads new lengths and queries on each replay
    lens, s_q, h = [700, 1, 65], 2, 32
    table, caches, _ = filled_caches(lens, 1, 1, B, "bf16", dev)
    q = torch.randn(len(lens), s_q, h, 576, device=dev).to(torch.bfloat16)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=dev)
    k_caches = [caches[0].view(caches[0].shape[0], B, 1, 576), caches[0].clone().view(-1, B, 1, 576)]
    checked = checked_launches(monkeypatch)
    meta = get_mla_metadata()[0]
    flash_mla_with_kvcache(q, k_caches[0], table, seqlens, 512, meta, None, causal=True)
    torch.cuda.synchronize()
    n = len(checked)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [flash_mla_with_kvcache(q, k_caches[layer % 2], table, seqlens, 512, meta, None, causal=True)
                for layer in range(4)]
    assert len(checked) == n + 1
    for new_lens in ([700, 1, 65], [3, 0, 64]):
        seqlens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        # eager on the same metadata: the same schedule, so the same bits
        want = flash_mla_with_kvcache(q, k_caches[0], table, seqlens, 512, meta, None, causal=True)
        for out, lse in outs:
            assert torch.equal(out, want[0]) and torch.equal(lse, want[1]), new_lens


# --- inputs built the way FlashMLA's own decode tests build theirs --------------------------------

def view_of_larger(x):
    """x as a view of a larger buffer: one more slot in every dim, 128 more in the last, the rest
    of the buffer NaN (or -1 for integers): a strided view with a unit last stride."""
    big = [n + 1 for n in x.shape[:-1]] + [x.shape[-1] + 128]
    fill = float("nan") if x.dtype.is_floating_point else -1
    buf = torch.full(big, fill, dtype=x.dtype, device=x.device)
    v = buf[tuple(slice(0, n) for n in x.shape)]
    v.copy_(x)
    return v


def paged_view(cache):
    """A [pages, B, row] cache as a view of [pages, B + 1, row] (a padded page dimension)."""
    fill = 0xFF if cache.dtype == torch.uint8 else float("nan")
    buf = torch.full((cache.shape[0], cache.shape[1] + 1, cache.shape[2]), fill, dtype=cache.dtype, device=cache.device)
    v = buf[:, :cache.shape[1]]
    v.copy_(cache)
    return v


def sink_reference(out, lse, sink):
    """out [.., h, 512] and lse [.., h] of the tokens, with FlashMLA's per-head sink."""
    f = torch.where(torch.isinf(lse), torch.zeros_like(lse), torch.sigmoid(lse - sink.double()))
    return out * f[..., None]


def test_flashmla_style_inputs_dense_and_sparse_fp8(dev):
    # strided views of larger buffers for q, the cache's pages and the index lists; NaN in every
    # unused cache slot (past each length, in the padding); block-table entries past the used
    # blocks set to a huge page index; zero-length requests; sinks of −inf, +inf and finite values
    torch.manual_seed(1)
    lens, s_q, h, bs = [300, 0, 129, 64], 2, 64, 64
    table, caches, keys = filled_caches(lens, 1, 1, bs, "bf16", dev)
    used = [-(-n // bs) for n in lens]
    for i, n in enumerate(used):
        table[i, n:] = 1 << 30
    q = view_of_larger(torch.randn(len(lens), s_q, h, 576, device=dev).to(torch.bfloat16))
    assert not q.is_contiguous()
    sink = torch.randn(h, device=dev)
    sink[0::4], sink[1::4] = -INF, INF
    k_cache = paged_view(caches[0]).unsqueeze(2)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=dev)
    out, lse = flash_mla_with_kvcache(q, k_cache, table, seqlens, 512, get_mla_metadata()[0], None,
                                      softmax_scale=0.07, attn_sink=sink)
    start = 0
    for i, n in enumerate(lens):
        for j in range(s_q):
            o, s, a = attention(q[i, j], keys[start:start + n], 0.07)
            want = sink_reference(o, s, sink)
            assert within_contract(out[i, j].double(), want, a), (i, j)
            if n == 0:
                assert torch.all(out[i, j] == 0) and torch.all(lse[i, :, j] == INF), "an empty row: 0 and +inf"
            else:
                assert (lse[i, :, j].double() - s).abs().max().item() <= 1e-5 + 2e-6 * s.abs().max().item(), (i, j)
        start += n
    # sparse FP8: index lists as views, a row of only −1, the cache's pages as a view
    table8, caches8, _ = filled_caches(lens, 1, 1, bs, "fp8_656", dev)
    deq = dequant_fp8(caches8[0])
    topk = 512
    idx = torch.full((len(lens), s_q, topk), -1, dtype=torch.int32, device=dev)
    for i, n in enumerate(lens):
        for j in range(s_q):
            if n == 0 or (i, j) == (2, 1):
                continue
            toks = torch.randperm(n, device=dev)[:min(n, topk - 10)]
            idx[i, j, :toks.numel()] = (table8[i].long()[toks // bs] * bs + toks % bs).int()
    idx_v = view_of_larger(idx)
    k8 = paged_view(caches8[0]).view(torch.float8_e4m3fn).unsqueeze(2)
    out, lse = flash_mla_with_kvcache(q, k8, None, None, 512, get_mla_metadata()[0], None, softmax_scale=0.07,
                                      is_fp8_kvcache=True, indices=idx_v, attn_sink=sink)
    for i in range(len(lens)):
        for j in range(s_q):
            sel = idx[i, j][idx[i, j] >= 0].long()
            rows = deq.view(-1, 576)[sel]
            o, s, a = attention(q[i, j], rows, 0.07)
            assert within_contract(out[i, j].double(), sink_reference(o, s, sink), a), ("sparse", i, j)
            if sel.numel() == 0:
                assert torch.all(out[i, j] == 0) and torch.all(lse[i, :, j] == INF)


def test_decode_writes_into_output_views(dev):
    # out as rows of a wider buffer and lse in FlashMLA's [b, h, s_q] layout: the same values as
    # contiguous outputs, bit for bit, and nothing written outside the views
    lens, nq, h, bs = [500, 0, 70], 2, 32, 64
    table, caches, _ = filled_caches(lens, 1, 1, bs, "bf16", dev)
    q = torch.randn(len(lens), nq, h, 576, device=dev).to(torch.bfloat16)
    rl = torch.tensor([[max(n - nq + 1 + j, 0) for j in range(nq)] for n in lens], dtype=torch.int32, device=dev)
    for splits in (1, None):
        out, lse = dcp_mla.decode_dense(q, caches[0], table, rl, num_splits=splits)
        out_big = torch.full((len(lens), nq, h + 1, 640), 7.0, dtype=torch.bfloat16, device=dev)
        lse_big = torch.full((len(lens), h, nq), 7.0, device=dev)
        out_v, lse_v = out_big[:, :, :h, :512], lse_big.transpose(1, 2)
        got_out, got_lse = dcp_mla.decode_dense(q, caches[0], table, rl, num_splits=splits, out=out_v, lse=lse_v)
        assert got_out is out_v and got_lse is lse_v
        assert torch.equal(out_v, out) and torch.equal(lse_v, lse), splits
        assert torch.all(out_big[:, :, h] == 7.0) and torch.all(out_big[..., 512:] == 7.0)


def test_operations_refuse_bad_integers_by_name(dev):
    """Every integer argument of the operations is checked by name before ctypes sees it: ctypes
    would take −1 as 2^64 − 1 and refuses a float naming no argument."""
    scores = torch.zeros(2, 64, device=dev)
    lens = torch.full((2,), 64, dtype=torch.int32, device=dev)
    for bad, err in [(-1, ValueError), (2.0, TypeError), (True, TypeError), (1 << 70, ValueError)]:
        with pytest.raises(err, match="^k: "):
            dcp_mla.topk_local(scores, lens, bad)
        with pytest.raises(err, match="^num_splits: "):
            dcp_mla.decode_workspace((1, 1, 16, 576), sparse=False, num_splits=bad, device=dev)
        with pytest.raises(err, match="^rank: "):
            dcp_mla.local_lens(lens, dcp_size=2, interleave=1, rank=bad)


def test_decode_dense_local_lengths_take_no_layout(dev):
    """A DCP layout given with local lengths would go unused: refused by name, not ignored."""
    q = torch.zeros(1, 1, 16, 576, dtype=torch.bfloat16, device=dev)
    cache = torch.zeros(1, 64, 576, dtype=torch.bfloat16, device=dev)
    table = torch.zeros(1, 1, dtype=torch.int32, device=dev)
    lens = torch.ones(1, 1, dtype=torch.int32, device=dev)
    for layout in [dict(dcp_size=2), dict(interleave=64), dict(rank=1)]:
        with pytest.raises(ValueError, match="^lens_rule: "):
            dcp_mla.decode_dense(q, cache, table, lens, **layout)
    # a 1-token request: rank 0 of 2 holds its token, rank 1 none (an empty row's lse is −inf)
    _, lse0 = dcp_mla.decode_dense(q, cache, table, lens, lens_rule="global", dcp_size=2, rank=0)
    _, lse1 = dcp_mla.decode_dense(q, cache, table, lens, lens_rule="global", dcp_size=2, rank=1)
    assert torch.isfinite(lse0).all() and (lse1 == -INF).all()


# --- MODEL1: FlashMLA's d_qk = 512 sparse path over its page-wise FP8 cache ----------------------
# The references are written here from docs/contract.md §3-§4 ("MODEL1"): the quantiser, the
# page layout and attention over the dequantised 512-value rows, in float64.

def model1_cache(pages, bs, dev, extra_bytes=0):
    """FlashMLA's MODEL1 cache: a [pages, model1_page_bytes(B) + extra_bytes] byte buffer of 0xff
    (NaN codes and NaN scales wherever no token is written), viewed [pages, B, 1, 584] as
    FlashMLA's quantize_k_cache returns it. Returns (buffer, view)."""
    buf = torch.full((pages, dcp_mla.model1_page_bytes(bs) + extra_bytes), 0xFF, dtype=torch.uint8, device=dev)
    return buf, buf[:, :bs * 584].view(pages, bs, 1, 584)


def model1_rows(n, dev):
    """n rows [n, 512] bf16: 7 tiles of 64 values of mixed magnitude (0, below the scale floor,
    0.1 to 10), then 64 rope values."""
    mags = torch.tensor([0.0, 1e-5, 0.1, 1.0, 3.0, 10.0], device=dev)[torch.randint(0, 6, (n, 7), device=dev)]
    nope = torch.randn(n, 7, 64, device=dev) * mags[..., None]
    return torch.cat([nope.view(n, 448), torch.randn(n, 64, device=dev) * 2], dim=1).to(torch.bfloat16)


def model1_quantize(rows):
    """rows bf16 [n, 512] → (value rows uint8 [n, 576], scale slots uint8 [n, 8]): tile t of 64
    values scaled by the smallest power of two ≥ max(amax / 448, 1e-4) (its fp32 exponent byte),
    codes e4m3 round-to-nearest-even; the 64 rope values' bf16 bytes; the pad byte 0."""
    n = rows.shape[0]
    x = rows[:, :448].float().view(n, 7, 64)
    bits = torch.clamp_min(x.abs().amax(-1) / 448.0, 1e-4).view(torch.int32)
    bits = torch.where(bits & 0x7FFFFF != 0, (bits & 0x7F800000) + 0x800000, bits)
    codes = (x / bits.view(torch.float32)[..., None]).to(torch.float8_e4m3fn).view(torch.uint8).view(n, 448)
    slots = torch.zeros(n, 8, dtype=torch.uint8, device=rows.device)
    slots[:, :7] = (bits >> 23).to(torch.uint8)
    return torch.cat([codes, rows[:, 448:].contiguous().view(torch.uint8)], dim=1), slots


def model1_place(buf, bs, slots, values, scales):
    """Writes value rows and scale slots at addresses `slots` (page·B + s) of a MODEL1 buffer
    [pages, page_bytes]: token s of a page at byte 576·s, its scales at 576·B + 8·s."""
    page, s = slots.long() // bs, slots.long() % bs
    buf[:, :bs * 576].unflatten(1, (bs, 576))[page, s] = values
    buf[:, bs * 576:bs * 584].unflatten(1, (bs, 8))[page, s] = scales


def model1_dequant(buf, bs):
    """Every slot of a MODEL1 buffer as [pages·B, 512] float64: code · 2^(byte − 127) for the 448
    (NaN where the code or the scale byte is NaN), the rope values widened."""
    vals = buf[:, :bs * 576].unflatten(1, (bs, 576)).reshape(-1, 576)
    sc = buf[:, bs * 576:bs * 584].unflatten(1, (bs, 8)).reshape(-1, 8)[:, :7].double()
    scale = torch.where(sc == 255, torch.full_like(sc, float("nan")), torch.exp2(sc - 127))
    nope = vals[:, :448].contiguous().view(torch.float8_e4m3fn).double().view(-1, 7, 64) * scale[..., None]
    return torch.cat([nope.view(-1, 448), vals[:, 448:].contiguous().view(torch.bfloat16).double()], dim=1)


def model1_source(pages, bs, dev, extra_bytes=0):
    """A MODEL1 cache with about half its slots holding quantised random rows: (buffer, its
    [pages, B, 1, 584] view, the dequantised rows [pages·B, 512], the written slots)."""
    buf, view = model1_cache(pages, bs, dev, extra_bytes)
    used = torch.randperm(pages * bs, device=dev)[:max(1, pages * bs // 2)]
    model1_place(buf, bs, used, *model1_quantize(model1_rows(used.numel(), dev)))
    return buf, view, model1_dequant(buf, bs), used


def model1_lists(used, slots, b, s_q, k, dev, empty=()):
    """Index lists [b, s_q, k] of written slots with −1, other negatives and addresses past the
    cache mixed in; the rows (i, j) in `empty` all −1."""
    idx = used[torch.randint(0, used.numel(), (b, s_q, k), device=dev)].int()
    r = torch.randint(0, 16, (b, s_q, k), device=dev)
    idx[r == 0], idx[r == 1], idx[r == 2] = -1, slots + 3, -9
    for i, j in empty:
        idx[i, j] = -1
    return idx


def attention512(q_row, keys, scale):
    """q_row [H, 512], keys [n, 512] float64 (V is the whole row) → out [H, 512], lse [H], A."""
    h = q_row.shape[0]
    if keys.shape[0] == 0:
        z = torch.zeros(h, 512, dtype=torch.float64, device=q_row.device)
        return z, torch.full((h,), -INF, dtype=torch.float64, device=q_row.device), z
    s = scale * (q_row.double() @ keys.T)
    p = torch.softmax(s, dim=1)
    return p @ keys, torch.logsumexp(s, dim=1), p @ keys.abs()


def model1_reference(q, sources, scale=512 ** -0.5):
    """Per row (i, j): the first topk_len[i] (clamped) entries of each source's list that address
    its cache, the first source's then the second's, in one softmax. sources: [(rows, lists
    [b, s_q, k], topk_len [b] or None)]. Returns {(i, j): (out, lse, A)}."""
    b, s_q = q.shape[:2]
    ref = {}
    for i in range(b):
        for j in range(s_q):
            keys = []
            for rows, lists, tl in sources:
                k = lists.shape[-1]
                n = k if tl is None else min(max(int(tl[i]), 0), k)
                e = lists[i, j, :n].long()
                keys.append(rows[e[(e >= 0) & (e < rows.shape[0])]])
            ref[i, j] = attention512(q[i, j], torch.cat(keys), scale)
    return ref


def check_model1(out, lse, ref, what, sink=None):
    for (i, j), (o, s, a) in ref.items():
        want = o if sink is None else sink_reference(o, s, sink)
        assert within_contract(out[i, j].double(), want, a), (what, i, j)
        if torch.isinf(s).all():
            assert torch.all(out[i, j] == 0) and torch.all(lse[i, j] == -INF), (what, "an empty row", i, j)
        else:
            assert (lse[i, j].double() - s).abs().max().item() <= 1e-5 + 2e-6 * s.abs().max().item(), (what, i, j)


@pytest.mark.parametrize("d,i,b", [(1, 1, 64), (2, 1, 61), (4, 2, 2)])
def test_kv_fill_model1_writes_the_contract_bytes(dev, d, i, b):
    # every owned token's value row and scale slot, bit for bit; every other byte (other ranks'
    # tokens, unused slots, the pages' padding and the wider page dimension) untouched
    lens = [5, 130, 0, 64]
    table, pages = paged_table(lens, d, b, dev)
    rows = model1_rows(sum(lens), dev)
    req = torch.cat([torch.full((n,), r, dtype=torch.int32) for r, n in enumerate(lens)]).to(dev)
    pos = torch.cat([torch.arange(n, dtype=torch.int32) for n in lens]).to(dev)
    values, scales = model1_quantize(rows)
    g = pos.long()
    lp = local_pos(g, d, i)
    addr = table[req.long(), lp // b].long() * b + lp % b
    for r in range(d):
        buf, view = model1_cache(pages, b, dev, extra_bytes=576 * (d - 1))
        assert dcp_mla.kv_fill_model1(rows[:, :448], rows[:, 448:], req, pos, table, view, dcp_size=d, interleave=i,
                                      rank=r) is view
        want, _ = model1_cache(pages, b, dev, extra_bytes=576 * (d - 1))
        own = owner(g, d, i) == r
        model1_place(want, b, addr[own], values[own], scales[own])
        assert torch.equal(buf, want), (d, i, b, r)


@pytest.mark.parametrize("splits,out_dtype", [(1, torch.bfloat16), (None, torch.float32), (3, torch.float32)])
def test_decode_model1_matches_attention(dev, splits, out_dtype):
    # two sources (block sizes 64 and 2, the second's pages a view of a wider page dimension),
    # per-request lengths at their edges, an empty row; the default scale is 512^-1/2
    b, s_q, h, k1, k2 = 6, 2, 32, 128, 48
    _, c1, rows1, used1 = model1_source(12, 64, dev)
    _, c2, rows2, used2 = model1_source(40, 2, dev, extra_bytes=1152)
    idx1 = model1_lists(used1, 12 * 64, b, s_q, k1, dev, empty=[(2, 1)])
    idx2 = model1_lists(used2, 80, b, s_q, k2, dev, empty=[(2, 1)])
    tl1 = torch.tensor([k1, 0, 1, k1 + 5, -3, 70], dtype=torch.int32, device=dev)
    tl2 = torch.tensor([k2, 0, 7, 0, k2 + 1, 2], dtype=torch.int32, device=dev)
    q = torch.randn(b, s_q, h, 512, device=dev).to(torch.bfloat16)
    out, lse = dcp_mla.decode_model1(q, c1, idx1, topk_len=tl1, extra_cache=c2, extra_indices=idx2,
                                     extra_topk_len=tl2, num_splits=splits, out_dtype=out_dtype)
    assert out.dtype == out_dtype and out.shape == (b, s_q, h, 512) and lse.shape == (b, s_q, h)
    check_model1(out, lse, model1_reference(q, [(rows1, idx1, tl1), (rows2, idx2, tl2)]), "two sources")
    assert torch.all(out[1] == 0) and torch.all(lse[1] == -INF), "request 1 reads no entry of either list"
    # one source, [b, s_q] lengths, an explicit scale
    tl = tl1.view(b, 1).expand(b, s_q).contiguous()
    out, lse = dcp_mla.decode_model1(q, c1, idx1, topk_len=tl, scale=0.03, num_splits=splits, out_dtype=out_dtype)
    check_model1(out, lse, model1_reference(q, [(rows1, idx1, tl1)], scale=0.03), "one source")
    # sinks: out scaled per head, lse unchanged
    sink = sinks_for(h, dev)
    out, lse = dcp_mla.decode_model1(q, c1, idx1, extra_cache=c2, extra_indices=idx2, num_splits=splits,
                                     out_dtype=torch.float32)
    out_s, lse_s = dcp_mla.decode_model1(q, c1, idx1, extra_cache=c2, extra_indices=idx2, num_splits=splits,
                                         out_dtype=torch.float32, sink=sink)
    assert torch.equal(lse_s, lse)
    assert close_with_nans(out_s, sinked(out, lse, sink), 2e-6 * out.abs().max().item())


def test_flash_mla_face_model1_matches_native_and_attention(dev):
    # inputs as FlashMLA's own MODEL1 tests build them: q and the index lists strided views of
    # larger buffers, float8_e4m3fn caches [num_blocks, B, 1, 584] of padded pages (the second a
    # view of a wider page dimension), per-request topk_length and extra_topk_length, NaN bytes in
    # every slot no index reads, attention sinks of −inf, +inf and finite values
    torch.manual_seed(3)
    b, s_q, h = 4, 2, 64
    _, c1, rows1, used1 = model1_source(40, 64, dev)
    _, c2, rows2, used2 = model1_source(60, 2, dev, extra_bytes=576)
    k1, k2 = c1.view(torch.float8_e4m3fn), c2.view(torch.float8_e4m3fn)
    idx1 = model1_lists(used1, 40 * 64, b, s_q, 128, dev)
    idx2 = model1_lists(used2, 120, b, s_q, 64, dev)
    tl1 = torch.tensor([128, 0, 77, 500], dtype=torch.int32, device=dev)
    tl2 = torch.tensor([64, 0, 1, 30], dtype=torch.int32, device=dev)
    q = view_of_larger(torch.randn(b, s_q, h, 512, device=dev).to(torch.bfloat16))
    sink = torch.randn(h, device=dev)
    sink[0::4], sink[1::4] = -INF, INF
    meta = get_mla_metadata()[0]

    def face(meta, cache=k1, **kw):
        args = dict(is_fp8_kvcache=True, indices=view_of_larger(idx1), attn_sink=sink, extra_k_cache=k2,
                    extra_indices_in_kvcache=view_of_larger(idx2), topk_length=tl1, extra_topk_length=tl2)
        args.update(kw)
        return flash_mla_with_kvcache(q, cache, None, None, 512, meta, None, **args)

    out, lse = face(meta)
    assert out.shape == (b, s_q, h, 512) and out.dtype == torch.bfloat16 and lse.shape == (b, h, s_q)
    nout, nlse = dcp_mla.decode_model1(q, k1, idx1, topk_len=tl1, extra_cache=k2, extra_indices=idx2,
                                       extra_topk_len=tl2, sink=sink, num_splits=meta.num_splits)
    assert torch.equal(out.view(torch.int16), nout.view(torch.int16))
    nl = nlse.transpose(1, 2)
    assert torch.equal(lse, torch.where(nl == -INF, INF, nl)), "FlashMLA's lse: [b, h, s_q], +inf for empty rows"
    # against attention at FlashMLA's default scale, d_qk^-1/2 = 512^-1/2
    ref = model1_reference(q, [(rows1, idx1, tl1), (rows2, idx2, tl2)])
    for (i, j), (o, s, a) in ref.items():
        assert within_contract(out[i, j].double(), sink_reference(o, s, sink), a), (i, j)
    assert torch.all(out[1] == 0) and torch.all(lse[1] == INF), "request 1 reads nothing: out 0, lse +inf"
    # the step's next layer reuses the schedule: the same bits
    assert meta.scheduled
    out2, lse2 = face(meta)
    assert torch.equal(out2.view(torch.int16), out.view(torch.int16)) and torch.equal(lse2, lse)
    # one source, uint8 cache bytes, an explicit scale, no sink
    out1, lse1 = face(get_mla_metadata()[0], cache=c1, softmax_scale=0.05, attn_sink=None, extra_k_cache=None,
                      extra_indices_in_kvcache=None, extra_topk_length=None)
    for (i, j), (o, s, a) in model1_reference(q, [(rows1, idx1, tl1)], scale=0.05).items():
        assert within_contract(out1[i, j].double(), o, a), ("one source", i, j)
    with pytest.raises(ValueError, match="tile_scheduler_metadata"):
        face(meta, extra_k_cache=None, extra_indices_in_kvcache=None, extra_topk_length=None)
    with pytest.raises(ValueError, match="extra_k_cache"):
        face(get_mla_metadata()[0], extra_k_cache=None)


@pytest.mark.parametrize("path", ["native", "ctypes"])
def test_decode_dense_launch_cache(dev, monkeypatch, path):
    """ops.decode_dense replays this thread's last checked launch for a call of the same key
    (shapes, strides, dtypes, devices, which are None, the other arguments, the stream): bit for
    bit a checked call's result, with each call's own pointers; a changed stride is checked again.
    Keyed and replayed natively (python/src/launch.rs) and through ctypes alike."""
    from dcp_mla import ops
    if path == "ctypes":
        monkeypatch.setattr(ops, "_NATIVE", None)
    else:
        native_launch_or_fail()
    name = "dcp_mla_launch_decode_dense"
    lens, nq, h = [700, 1, 65], 2, 32
    table, caches, _ = filled_caches(lens, 1, 1, B, "bf16", dev)
    cache = caches[0]
    q = torch.randn(len(lens), nq, h, 576, device=dev).to(torch.bfloat16)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=dev)
    splits, ws = dcp_mla.decode_workspace(q.shape, sparse=False, device=dev)
    args = dict(q=q, cache=cache, block_table=table, lens=seqlens)

    def decode(**change):
        a = dict(args, **change)
        return dcp_mla.decode_dense(a["q"], a["cache"], a["block_table"], a["lens"], num_splits=splits, workspace=ws,
                                    lens_rule="global_causal")

    def same(got, want):
        return torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

    ops._op_launches.__dict__.clear()
    first = decode()
    entry = ops._op_launches.__dict__[name]
    assert same(decode(), first) and ops._op_launches.__dict__[name] is entry, "the same key again: replayed"
    # a pointer that moves is read from its new place (the original overwritten first)
    for arg, scramble in [("q", 0.0), ("cache", 0.0), ("block_table", 0), ("lens", 1)]:
        original = args[arg]
        copy = original.clone()
        original.fill_(scramble)
        assert same(decode(**{arg: copy}), first), arg
        original.copy_(copy)
    assert ops._op_launches.__dict__[name] is entry, "pointers alone changed: every call replayed"
    # a stride that changes takes the checked path (a new entry), with a checked call's result
    paged = paged_view(cache)
    got = decode(cache=paged)
    assert ops._op_launches.__dict__[name] is not entry
    ops._op_launches.__dict__.clear()
    assert same(got, decode(cache=paged))
    # without a workspace: the library's own for the stream, remembered and taken again by a replay
    ops._op_launches.__dict__.clear()
    ops._owned_workspaces.clear()
    own = dcp_mla.decode_dense(q, cache, table, seqlens, num_splits=splits, lens_rule="global_causal")
    assert same(own, first)
    assert splits > 1, "the planner splits this problem (3 sequences of one row block: a wave of parts)"
    owned = list(ops._owned_workspaces.values())
    assert len(owned) == 1 and ops._op_launches.__dict__[name].ws_need == owned[0].numel()
    entry = ops._op_launches.__dict__[name]
    owned[0].fill_(0xff)  # a stale schedule there must not matter: every call computes its own
    assert same(dcp_mla.decode_dense(q, cache, table, seqlens, num_splits=splits, lens_rule="global_causal"),
                first)
    assert ops._op_launches.__dict__[name] is entry and list(ops._owned_workspaces.values())[0] is owned[0]
    # another stream: a workspace of its own
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = dcp_mla.decode_dense(q, cache, table, seqlens, num_splits=splits, lens_rule="global_causal")
    torch.cuda.current_stream().wait_stream(side)
    assert same(on_side, first) and len(ops._owned_workspaces) == 2
    # a workspace allocated for one call (a capture's) is never remembered: a replay would have none
    ops._op_launches.__dict__.clear()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dcp_mla.decode_dense(q, cache, table, seqlens, num_splits=splits, lens_rule="global_causal")  # warm-up
    torch.cuda.current_stream().wait_stream(side)
    ops._op_launches.__dict__.clear()
    n_owned = len(ops._owned_workspaces)
    with torch.cuda.graph(graph):
        captured = dcp_mla.decode_dense(q, cache, table, seqlens, num_splits=splits, lens_rule="global_causal")
    assert name not in ops._op_launches.__dict__ and len(ops._owned_workspaces) == n_owned
    graph.replay()
    torch.cuda.synchronize()
    assert same(captured, first)


# --- the native decode launches (python/src/launch.rs) against the ctypes path ------------------

def native_launch_or_fail():
    """The native launch module; where torch publishes the DLPack C exchange API it must be bound."""
    from dcp_mla import ops
    if ops._NATIVE is None:
        if hasattr(torch.Tensor, "__dlpack_c_exchange_api__") and os.environ.get("DCP_MLA_NATIVE_LAUNCH") != "0" \
                and not os.environ.get("DCP_MLA_LIB"):
            pytest.fail("torch publishes __dlpack_c_exchange_api__ but ops bound no native launch")
        pytest.skip("no native launch on this torch")
    return ops


def test_native_decode_launch_is_the_ctypes_launch(dev, monkeypatch):
    """decode_dense and decode_sparse launched natively and through ctypes: the same struct in
    the thread's argument struct (_last_launch), the same results bit for bit, on a side stream
    (the native side takes torch's current stream from the exchange API)."""
    ops = native_launch_or_fail()
    lens, nq, h, bs = [500, 0, 70], 2, 32, 64
    table, caches, _ = filled_caches(lens, 1, 1, bs, "bf16", dev)
    q = torch.randn(len(lens), nq, h, 576, device=dev).to(torch.bfloat16)
    rl = torch.tensor([[max(n - nq + 1 + j, 0) for j in range(nq)] for n in lens], dtype=torch.int32, device=dev)
    out = torch.empty(len(lens), h, nq, 512, dtype=torch.bfloat16, device=dev).transpose(1, 2)
    lse = torch.empty(len(lens), h, nq, device=dev).transpose(1, 2)
    splits, ws = dcp_mla.decode_workspace(q.shape, sparse=False, device=dev)
    sparse_splits, sparse_ws = dcp_mla.decode_workspace(q.shape, sparse=True, device=dev)
    k = 512
    # every row lists cache rows of its own request's tokens (the cache's unused slots hold NaN)
    idx = torch.full((len(lens), nq, k), -1, dtype=torch.int32, device=dev)
    for req, n in enumerate(lens):
        for j in range(nq):
            toks = torch.randperm(n)[:min(n, k)].to(dev)
            idx[req, j, :toks.numel()] = (table[req].long()[toks // bs] * bs + toks % bs).int()
    side = torch.cuda.Stream()
    native, compute, bf16 = ops._NATIVE, dcp_mla._lib.SCHEDULE_COMPUTE, dcp_mla._lib.KV_BF16
    ops._dev_stream(q)  # the device opened (and registered with the native side)
    results = {}
    for path in ("native", "ctypes"):
        with torch.cuda.stream(side):
            if path == "native":
                # called directly, so that a fallback to ctypes cannot pass for the native launch
                assert native.current_stream(q.device.index) == side.cuda_stream
                assert native.decode_dense(ops._native_dst(ops._DENSE), ops._DENSE_SIZE, q, caches[0], table, rl, out,
                                           lse, ws, None, 0.1, splits, compute, 0, 0, 1, 1, 0) == 0
            else:
                monkeypatch.setattr(ops, "_NATIVE", None)
                ops._decode_dense(q, caches[0], table, rl, out, lse, ws, 0.1, splits, compute, None, 0, 0, 1, 1, 0)
            dense_struct = bytes(ops._last_launch(ops._DENSE)[1])
            dense = (out.clone(), lse.clone())
            if path == "native":
                assert native.decode_sparse(ops._native_dst(ops._SPARSE), ops._SPARSE_SIZE, q, caches[0], idx, None,
                                            out, lse, sparse_ws, None, 0.1, bf16, sparse_splits, compute, 1) == 0
            else:
                ops._decode_sparse(q, caches[0], bf16, idx, None, out, lse, sparse_ws, 0.1, sparse_splits, compute,
                                   None, 1)
            sparse_struct = bytes(ops._last_launch(ops._SPARSE)[1])
            sparse = (out.clone(), lse.clone())
        side.synchronize()
        results[path] = (dense_struct, dense, sparse_struct, sparse)
    a, b = results["native"], results["ctypes"]
    assert a[0] == b[0] and a[2] == b[2]
    for x, y in zip(a[1] + a[3], b[1] + b[3]):
        assert torch.equal(x, y)


def test_native_decode_launch_errors_name_the_field(dev):
    """A launch the library refuses through the native path raises its DcpMlaError, naming the
    field, as through ctypes; a scalar the native side cannot hold takes the ctypes path's error."""
    ops = native_launch_or_fail()
    q = torch.randn(2, 1, 16, 576, device=dev).to(torch.bfloat16)
    cache = torch.randn(4, 64, 576, device=dev).to(torch.bfloat16)
    table = torch.arange(4, dtype=torch.int32, device=dev).view(2, 2)
    lens = torch.full((2, 1), 100, dtype=torch.int32, device=dev)
    out = torch.empty(2, 1, 16, 512, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(2, 1, 16, device=dev)
    ops._dev_stream(q)  # the device opened (and registered with the native side)
    at = ops._native_dst(ops._DENSE)
    assert ops._NATIVE.decode_dense(at, ops._DENSE_SIZE, q, cache, table, lens, out, lse, None, None, 0.1, 8, 0, 0, 0,
                                    1, 1, 0) not in (0, ops._FALLBACK), "refused by the library, not left to ctypes"
    with pytest.raises(DcpMlaError, match="workspace"):
        ops._decode_dense(q, cache, table, lens, out, lse, None, 0.1, 8, 0, None, 0, 0, 1, 1, 0)
    with pytest.raises((TypeError, ValueError), match="num_splits"):
        ops._decode_dense(q, cache, table, lens, out, lse, None, 0.1, -1, 0, None, 0, 0, 1, 1, 0)


@pytest.mark.parametrize("path", ["native", "ctypes"])
def test_decode_sparse_launch_cache(dev, monkeypatch, path):
    """ops.decode_sparse replays this thread's last checked launch as decode_dense does: bit for
    bit a checked call's result with each call's own pointers; a changed stride or kv_format is
    checked again. Keyed and replayed natively and through ctypes alike."""
    from dcp_mla import ops
    if path == "ctypes":
        monkeypatch.setattr(ops, "_NATIVE", None)
    else:
        native_launch_or_fail()
    q, cache, _, indices, topk_length, _ = sparse_face_problem(dev, 512, [400, 300])
    args = dict(q=q, cache=cache, indices=indices, topk_len=topk_length.view(-1, 1))

    def decode(**change):
        a = dict(args, **change)
        return dcp_mla.decode_sparse(a["q"], a["cache"], a["indices"], topk_len=a["topk_len"], kv_format="fp8_656")

    def same(got, want):
        return torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

    ops._op_launches.__dict__.clear()
    first = decode()
    entry = ops._op_launches.__dict__[ops._SPARSE]
    assert same(decode(), first) and ops._op_launches.__dict__[ops._SPARSE] is entry, "the same key: replayed"
    for arg, scramble in [("q", 0.0), ("cache", 0), ("indices", -1), ("topk_len", 0)]:
        original = args[arg]
        copy = original.clone()
        original.fill_(scramble)
        assert same(decode(**{arg: copy}), first), arg
        original.copy_(copy)
    assert ops._op_launches.__dict__[ops._SPARSE] is entry, "pointers alone changed: every call replayed"
    # indices as a view of wider lists: another stride, the checked path, the same result
    wide = torch.full((indices.shape[0], 1, 2 * indices.shape[2]), -1, dtype=torch.int32, device=dev)
    wide[..., :indices.shape[2]] = indices
    got = decode(indices=wide[..., :indices.shape[2]])
    assert ops._op_launches.__dict__[ops._SPARSE] is not entry and same(got, first)
    # another kv_format given for the same cache is checked (and refused), never replayed
    with pytest.raises(ValueError, match="kv_format"):
        dcp_mla.decode_sparse(q, cache, indices, topk_len=args["topk_len"], kv_format="bf16")
