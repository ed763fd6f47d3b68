"""The engine's model-facing math on the CPU: python/examples/mla_engine.py's absorbed MLA (q's nope
part through W_UK into the latent, the latent output back through W_UV, the model's RoPE in the
576-value row, the model's softmax scale), paged DCP shards, chunked prefill over a gathered prefix,
MTP rows and the V3.2 indexer's top-k, run with the pure-torch stand-in of the kernels in exact fp32
(TorchBackend(emulate=False)), against transformers' own eager fp32 forward, teacher-forced, and
against its greedy generate.

The stand-in computes in fp32 what the kernels compute, so the only differences from transformers
are fp32 summation orders: logits agree to ~1e-6 (observed ≤ 6e-7 with logits ≤ 1), checked at
1e-5. Small sizes (4 heads, hidden 128, top-k 16 over prompts of 17-40 tokens, pages of 8) keep it
to seconds. Skipped where torch or transformers (or, for V3.2, DeepseekV32ForCausalLM) is missing:
CI installs neither."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "DeepseekV3ForCausalLM"):
    pytest.skip(f"transformers {transformers.__version__} has no DeepseekV3ForCausalLM", allow_module_level=True)

import model_check as mc  # noqa: E402

me = mc.me
PROMPTS, NEW, TOPK = (40, 23, 31, 17), 8, 16
SIZES = dict(layers=2, heads=4, hidden=128, vocab=256, q_lora_rank=64, index_topk=TOPK, index_heads=16)
TOL = 1e-5


def needs(kind):
    if kind == "v32" and not me.is_v32_available():
        pytest.skip(f"transformers {transformers.__version__} has no DeepseekV32ForCausalLM (5.13 and later)")


@pytest.fixture(autouse=True)
def _threads():
    old = torch.get_num_threads()
    torch.set_num_threads(min(old, 4))
    yield
    torch.set_num_threads(old)


@pytest.mark.parametrize("kind,d,nq,fmt,combine,rope_interleave", [
    ("v3", 1, 1, "bf16", "a2a", True),
    ("v3", 2, 2, "bf16", "ag_rs", True),
    ("v3", 4, 1, "fp8_656", "a2a", False),
    ("v32", 1, 1, "bf16", "a2a", True),
    ("v32", 2, 1, "fp8_656", "a2a", True),
    ("v32", 4, 2, "bf16", "ag_rs", True),
])
def test_absorbed_mla_matches_transformers_teacher_forced(kind, d, nq, fmt, combine, rope_interleave):
    needs(kind)
    sizes = dict(SIZES, rope_interleave=rope_interleave) if kind == "v3" else SIZES
    model = me.tiny_model(kind, **sizes)
    seqs = mc.sequences(PROMPTS, NEW, SIZES["vocab"])
    ref, sel, scores = mc.reference(model, seqs, PROMPTS, with_selection=kind == "v32")
    # FP8-656 rows: the stand-in stores what the format keeps, so compare with exact bf16 rows off
    backend = me.TorchBackend(emulate=False)
    eng, ours = mc.engine_teacher_forced(model, backend, seqs, PROMPTS, NEW, nq=nq, dcp_size=d, kv_format="bf16",
                                         block_size=8, prefill_chunk=16, combine=combine, record=True)
    err = mc.step_errors(ours, ref)
    scale = max(float(r.abs().max()) for r in ref)
    assert float(err.max()) <= TOL * max(scale, 1), f"max |Δlogit| {float(err.max()):.3e} (logits ≤ {scale:.3f})"
    bad, decisive = mc.argmax_mismatches(ours, ref, TOL)
    assert not bad and decisive > 0, bad
    if kind == "v32":
        assert eng.trace, "no V3.2 decode row was recorded"
        worst = mc.score_errors(eng.trace, scores, nq)
        bad, compared, _ = mc.selection_mismatches(eng.trace, sel, scores, nq, TOPK, 1e-5)
        assert not bad and compared == SIZES["layers"] * NEW * len(PROMPTS), (bad, compared, worst)
    if fmt == "fp8_656":
        # the same run over FP8-656 shards: FP8-level agreement (e4m3 keeps 3 mantissa bits of c_kv)
        eng8, ours8 = mc.engine_teacher_forced(model, backend, seqs, PROMPTS, NEW, nq=nq, dcp_size=d,
                                               kv_format="fp8_656", block_size=8, prefill_chunk=16, combine=combine)
        err8 = float(mc.step_errors(ours8, ref).max())
        assert err8 <= 0.1 * max(scale, 1), err8


@pytest.mark.parametrize("kind,d", [("v3", 2), ("v32", 4)])
def test_greedy_matches_generate(kind, d):
    needs(kind)
    model = me.make_decisive(me.tiny_model(kind, **SIZES))
    prompts = [s[:p] for s, p in zip(mc.sequences(PROMPTS, 0, SIZES["vocab"]), PROMPTS)]
    want = mc.reference_greedy(model, prompts, 16)
    got = mc.engine_greedy(model, me.TorchBackend(emulate=False), prompts, 16, dcp_size=d, block_size=8,
                           prefill_chunk=16)
    assert torch.equal(got, want), (got, want)
    assert len(set(want.flatten().tolist())) > 16, "the decisive model should still walk through many tokens"


def test_fp8_656_stand_in_keeps_the_format():
    # per 128-value group a power-of-two scale ≥ amax / 448 (and ≥ 1e-4), values e4m3·scale
    x = torch.randn(3, 512) * torch.tensor([1e-6, 1.0, 300.0]).view(3, 1)
    y = me.fp8_656_roundtrip(x)
    g = x.view(3, 4, 128)
    amax = g.abs().amax(-1)
    scale = torch.clamp(amax / 448, min=1e-4)
    p2 = torch.exp2(torch.ceil(torch.log2(scale)))
    assert torch.all(p2 >= scale) and torch.all(p2 / 2 < scale)
    q = (y.view(3, 4, 128) / p2[..., None])
    assert torch.equal(q, q.to(torch.float8_e4m3fn).float()), "stored values are e4m3 codes times the scale"
    assert float(((y - x).abs() / (x.abs() + 1e-30))[x.abs() > 1e-3].max()) <= 2 ** -4


def test_local_count_is_the_contracts():
    for d, i in [(1, 1), (2, 1), (4, 2)]:
        for length in range(0, 40):
            counts = [me.local_count(length, d, i, r) for r in range(d)]
            assert sum(counts) == length
            for r in range(d):
                assert counts[r] == sum(1 for t in range(length) if me.owner(t, d, i) == r)
                assert all(me.global_pos(me.local_pos(t, d, i), d, i, r) == t
                           for t in range(length) if me.owner(t, d, i) == r)
