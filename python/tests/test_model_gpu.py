"""A real model's decode through dcp-mla's kernels: transformers' DeepSeek-V3 and V3.2 (small random
weights, the real attention sizes: kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128,
v_head_dim 128; 2 layers, 8 heads, hidden 256, vocab 512, dense MLPs; V3.2's indexer with 16 heads of
128 and top-k 512) run by python/examples/mla_engine.py with the kernels (DcpMlaBackend) under DCP
D ∈ {1, 2, 4} simulated on the one GPU, against transformers' own forward (eager attention, fp32),
for 4 prompts of 700, 600, 530 and 300 tokens and 64 new tokens each (65 compared steps a request:
the prefill's last position, then 64 decode positions).

The error bound, and how it is derived. The engine's math is exact: with the torch stand-in in fp32
(TorchBackend(emulate=False)) it matches transformers to ~1e-6 (test_model_cpu.py, and checked here
again on the GPU at 1e-4 of the largest logit). Every remaining difference comes from the kernels'
roundings, which the contract (docs/contract.md §9) fixes: q and the cache rows in bf16 (2^-9
relative; FP8-656 rows: e4m3, 2^-4), P rounded to bf16 before P·V (≤ 2^-8·A_c), the a2a partials in
bf16 (≤ 2^-8·A_c), and fp32 accumulation order. The stand-in with those roundings applied
(TorchBackend(emulate=True): bf16 q and rows or FP8-656 rows bit-exact to kv_fill's, bf16 P, bf16
a2a partials) is run on the same model, format and D; E = its largest logit error over all steps and
requests. The kernels make the same roundings at the same magnitudes but at other places (online
softmax rescaling, split-KV order), so their error is another draw of the same size: the difference
of two such runs is at most E + E, and the bound is BOUND = 4·E (a margin of 2 over that) + 1e-5 of
the largest logit. On the CPU at these sizes E is 3.1-3.7e-3 (bf16) and 2.1e-2 (FP8) for V3, and
4.9-5.9e-3 (bf16) and 2.5e-2 (FP8) for V3.2 (whose top-k swaps near-tied tokens under rounding),
with logits up to ~1.5; the max over steps is 1.2-2× the median, so the bound is not set by one
outlier. The checks at every step:
- |logits − transformers'| ≤ BOUND elementwise;
- our argmax equals transformers' at every step whose top-2 gap exceeds 2·BOUND (each of the two
  logits may move by BOUND; a smaller gap may be swapped by rounding alone);
- V3.2: every decode row's selected set equals the indexer's own selection at that layer and
  position, except for near-ties: ids in the symmetric difference must have a reference score within
  TIE of the reference's K-th best score, TIE = 4·(the emulated run's largest index-score error)
  + 1e-6 of the largest score (a swap between tokens that close is rounding, not a bug).
Free-running greedy tokens equal transformers' generate for 64 tokens on a decisive model
(mla_engine.make_decisive: top-2 gaps ≥ 10, far above any bound), BF16 and FP8 caches.

Each test takes the `dev` fixture (conftest.py): skipped without a GPU, failed when
DCP_MLA_REQUIRE_GPU=1, as is a transformers without DeepseekV3 / DeepseekV32 (5.13 or later
needed for V3.2). Set DCP_MLA_MODEL_REPORT=<file> to append one line of numbers a test."""

import os

import pytest

REQUIRED = os.environ.get("DCP_MLA_REQUIRE_GPU") == "1"
torch = __import__("torch") if REQUIRED else pytest.importorskip("torch")
transformers = __import__("transformers") if REQUIRED else pytest.importorskip("transformers")

import model_check as mc  # noqa: E402

me = mc.me
PROMPTS, NEW, TOPK = (700, 600, 530, 300), 64, 512
VOCAB = 512
CASES = [(kind, d, fmt) for kind in ("v3", "v32") for d in (1, 2, 4) for fmt in ("bf16", "fp8_656")]


def _model(kind, dev, **kw):
    if kind == "v32" and not me.is_v32_available():
        msg = f"transformers {transformers.__version__} has no DeepseekV32ForCausalLM (5.13 or later)"
        if REQUIRED:
            pytest.fail(msg)
        pytest.skip(msg)
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference is fp32, not TF32
    torch.backends.cudnn.allow_tf32 = False
    return me.tiny_model(kind, device=dev, index_topk=TOPK, vocab=VOCAB, **kw)


def _report(line):
    path = os.environ.get("DCP_MLA_MODEL_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def _shape(d):
    """MTP-style rows (2 a step) at D = 2; the ag_rs combine at D = 4 for BF16 (a2a elsewhere)."""
    return (2 if d == 2 else 1), ("ag_rs" if d == 4 else "a2a")


@pytest.mark.parametrize("kind,d,fmt", CASES)
def test_teacher_forced_logits_within_the_bound(dev, kind, d, fmt):
    model = _model(kind, dev)
    nq, combine = _shape(d)
    combine = combine if fmt == "bf16" else "a2a"
    seqs = mc.sequences(PROMPTS, NEW, VOCAB)
    sparse = kind == "v32"
    ref, sel, scores = mc.reference(model, seqs, PROMPTS, with_selection=sparse)
    scale = max(float(r.abs().max()) for r in ref)
    run = dict(nq=nq, dcp_size=d, kv_format=fmt, combine=combine, record=sparse)

    # 1. the engine's math, exact: the fp32 stand-in
    _, exact = mc.engine_teacher_forced(model, me.TorchBackend(emulate=False), seqs, PROMPTS, NEW,
                                        **dict(run, kv_format="bf16"))
    e_exact = float(mc.step_errors(exact, ref).max())
    assert e_exact <= 1e-4 * max(scale, 1), f"fp32 stand-in differs from transformers by {e_exact:.3e}"

    # 2. the bound: the stand-in with the kernels' roundings
    emu_eng, emu = mc.engine_teacher_forced(model, me.TorchBackend(emulate=True), seqs, PROMPTS, NEW, **run)
    e_emu = float(mc.step_errors(emu, ref).max())
    bound = 4 * e_emu + 1e-5 * scale
    assert e_emu <= 0.1 * scale, f"the emulated roundings alone move logits by {e_emu:.3e} of {scale:.3f}"

    # 3. the kernels
    eng, ours = mc.engine_teacher_forced(model, me.DcpMlaBackend(), seqs, PROMPTS, NEW, **run)
    err = mc.step_errors(ours, ref)  # [65] steps
    bad_steps = [(t, float(e)) for t, e in enumerate(err) if e > bound]
    wrong, decisive = mc.argmax_mismatches(ours, ref, bound)
    line = (f"{kind} D={d} {fmt} nq={nq} {combine}: max|Δlogit| {float(err.max()):.3e} (median "
            f"{float(err.median()):.3e}), bound {bound:.3e} = 4·{e_emu:.3e} emulated; max|logit| {scale:.3f}; "
            f"argmax equal at {decisive - len(wrong)}/{decisive} decisive steps")
    if sparse:
        tie = 4 * mc.score_errors(emu_eng.trace, scores, nq) + 1e-6 * max(
            float(s[torch.isfinite(s)].abs().max()) for req in scores for s in req)
        bad_sel, compared, tied = mc.selection_mismatches(eng.trace, sel, scores, nq, TOPK, tie)
        line += f"; top-k rows {compared}, equal {compared - tied - len(bad_sel)}, near-tie swaps {tied} (tie {tie:.2e})"
    _report(line)
    assert not bad_steps, f"{line}; steps over the bound: {bad_steps[:8]}"
    assert not wrong, f"{line}; argmax differs at (request, step, gap): {wrong[:8]}"
    if sparse:
        assert not bad_sel, f"{line}; selections differing beyond near-ties: {bad_sel[:8]}"
        assert compared == len(model.model.layers) * NEW * len(PROMPTS)


@pytest.mark.parametrize("kind,d,fmt", CASES)
def test_greedy_tokens_equal_generate(dev, kind, d, fmt):
    model = me.make_decisive(_model(kind, dev))
    prompts = [s[:p] for s, p in zip(mc.sequences(PROMPTS, 0, VOCAB), PROMPTS)]
    want = mc.reference_greedy(model, prompts, NEW)
    got = mc.engine_greedy(model, me.DcpMlaBackend(), prompts, NEW, dcp_size=d, kv_format=fmt)
    _report(f"greedy {kind} D={d} {fmt}: {int((got == want).all(1).sum())}/{len(prompts)} requests identical, "
            f"{len(set(want.flatten().tolist()))} distinct tokens")
    assert torch.equal(got, want), [(k, int((got[k] != want[k]).nonzero()[0])) for k in range(len(prompts))
                                    if not torch.equal(got[k], want[k])]
