"""Shared by test_model_cpu.py and test_model_gpu.py: transformers' own runs of a model (teacher-forced
logits, the V3.2 indexer's own selection and scores, greedy generate) and the engine's runs of the
same, from python/examples/mla_engine.py."""

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))

import mla_engine as me  # noqa: E402


def sequences(prompt_lens, new, vocab, seed=3):
    """One token sequence per request: its prompt, then `new` teacher tokens."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (p + new,), generator=g) for p in prompt_lens]


def reference(model, seqs, prompt_lens, with_selection=False):
    """transformers' own forward (the model's attention as configured: eager) over each whole
    sequence. Returns the logits of positions p − 1 .. end − 1 of each [new + 1, vocab] and, for
    V3.2 with with_selection, per request per layer the indexer's top-k [S, K] and its scores [S, S]
    (computed from the indexer's own inputs with the engine's formula, −inf above the diagonal)."""
    dev = next(model.parameters()).device
    logits, sel, scores = [], [], []
    hooks, cap = [], {}
    if with_selection:
        rope_half = me.model_functions(model.model.layers[0].self_attn)[0]
        for n, layer in enumerate(model.model.layers):
            idx = layer.self_attn.indexer

            def pre(mod, args, kwargs, n=n):
                x, q_resid, (cos, sin) = args[0], args[1], args[2]
                q, w, k = me.indexer_query_key(mod, x, q_resid, cos, sin, rope_half)
                s = x.shape[1]
                sc = me.index_scores(mod, q[0], w[0], k[0].expand(s, -1, -1))
                cap[("scores", n)] = sc.masked_fill(torch.ones(s, s, dtype=torch.bool, device=sc.device).triu(1),
                                                    float("-inf"))

            def post(mod, args, kwargs, out, n=n):
                cap[("sel", n)] = out[0]

            hooks.append(idx.register_forward_pre_hook(pre, with_kwargs=True))
            hooks.append(idx.register_forward_hook(post, with_kwargs=True))
    try:
        with torch.no_grad():
            for s, p in zip(seqs, prompt_lens):
                out = model(input_ids=s[None].to(dev), use_cache=False).logits[0]
                logits.append(out[p - 1:].float())
                if with_selection:
                    layers = range(len(model.model.layers))
                    sel.append([cap[("sel", n)].long() for n in layers])
                    scores.append([cap[("scores", n)] for n in layers])
    finally:
        for h in hooks:
            h.remove()
    return logits, sel, scores


def engine_teacher_forced(model, backend, seqs, prompt_lens, new, *, nq=1, dcp_size=1, kv_format="bf16",
                          block_size=64, prefill_chunk=256, combine="a2a", record=False, interleave=1):
    """The engine over the same tokens: each prompt prefilled, then `new` tokens fed nq a step to the
    whole batch. Returns the engine and each request's logits [new + 1, vocab] (positions p − 1 ..)."""
    eng = me.MLAEngine(model, backend, batch=len(seqs), max_len=max(prompt_lens) + new + 8, dcp_size=dcp_size,
                       interleave=interleave, block_size=block_size, kv_format=kv_format,
                       prefill_chunk=prefill_chunk, combine=combine, record=record)
    rows = [[eng.prefill(k, s[:p].tolist()).float()] for k, (s, p) in enumerate(zip(seqs, prompt_lens))]
    for st in range(0, new, nq):
        toks = torch.stack([s[p + st:p + st + nq] for s, p in zip(seqs, prompt_lens)])
        lg = eng.decode(toks)
        for k in range(len(seqs)):
            rows[k].extend(lg[k].float())
    # the last step's logits predict past the sequence: keep positions p − 1 .. p + new − 1
    return eng, [torch.stack(r[:new + 1]) for r in rows]


def step_errors(ours, ref):
    """max over requests and vocabulary of |ours − ref| at each step [new + 1]."""
    return torch.stack([(o.to(r.device) - r).abs().amax(-1) for o, r in zip(ours, ref)]).amax(0)


def argmax_mismatches(ours, ref, bound):
    """Steps (request, step) where the reference's top-2 gap exceeds 2·bound (so no error within the
    bound can swap its leader) and our argmax differs; and how many steps were that decisive."""
    bad, decisive = [], 0
    for k, (o, r) in enumerate(zip(ours, ref)):
        top = r.topk(2, dim=-1)
        gap = top.values[:, 0] - top.values[:, 1]
        for t in range(r.shape[0]):
            if gap[t] > 2 * bound:
                decisive += 1
                if int(o[t].argmax()) != int(top.indices[t, 0]):
                    bad.append((k, t, float(gap[t])))
    return bad, decisive


def selection_mismatches(trace, ref_sel, ref_scores, nq, k_top, tie_tol):
    """Every decode row's selected ids against transformers' own selection at that position and
    layer. A difference is allowed only between near-ties: every id in the symmetric difference has a
    reference score within tie_tol of the reference's K-th best visible score. Returns the bad rows
    and the number of rows compared (and how many differed within the tolerance)."""
    bad, compared, tied = [], 0, 0
    for entry in trace:
        layer = entry["layer"]
        for row, pos in enumerate(entry["positions"].tolist()):
            req = row // nq
            ours = set(x for x in entry["ids"][row].tolist() if x >= 0)
            theirs = set(x for x in ref_sel[req][layer][pos].tolist() if x <= pos)
            compared += 1
            if ours == theirs:
                continue
            sc = ref_scores[req][layer][pos, :pos + 1]
            if pos + 1 <= k_top:
                bad.append((layer, req, pos, "all visible tokens are selected", len(ours), len(theirs)))
                continue
            kth = sc.topk(k_top).values[-1]
            diff = torch.tensor(sorted(ours ^ theirs), device=sc.device)
            far = (sc[diff] - kth).abs() > tie_tol
            if bool(far.any()) or len(ours) != len(theirs):
                bad.append((layer, req, pos, float((sc[diff] - kth).abs().max()), len(ours), len(theirs)))
            else:
                tied += 1
    return bad, compared, tied


def score_errors(trace, ref_scores, nq):
    """max |our index score − transformers'| over every recorded decode row (finite entries)."""
    worst = 0.0
    for entry in trace:
        layer = entry["layer"]
        for row, pos in enumerate(entry["positions"].tolist()):
            ours = entry["scores"][row, :pos + 1].to(ref_scores[0][0].device)
            theirs = ref_scores[row // nq][layer][pos, :pos + 1]
            worst = max(worst, float((ours - theirs).abs().max()))
    return worst


def engine_greedy(model, backend, prompts, new, *, dcp_size=1, kv_format="bf16", block_size=64,
                  prefill_chunk=256, combine="a2a"):
    """Free-running greedy decoding of `new` tokens for every prompt at once (a batch)."""
    eng = me.MLAEngine(model, backend, batch=len(prompts), max_len=max(len(p) for p in prompts) + new + 8,
                       dcp_size=dcp_size, block_size=block_size, kv_format=kv_format, prefill_chunk=prefill_chunk,
                       combine=combine)
    nxt = torch.stack([eng.prefill(k, p.tolist()).argmax() for k, p in enumerate(prompts)])
    out = [nxt]
    for _ in range(new - 1):
        nxt = eng.decode(nxt.view(-1, 1))[:, 0].argmax(-1)
        out.append(nxt)
    return torch.stack(out, 1).cpu()


def reference_greedy(model, prompts, new):
    """transformers' generate (greedy, its own KV cache), one prompt at a time (no padding)."""
    dev = next(model.parameters()).device
    rows = []
    with torch.no_grad():
        for p in prompts:
            ids = p[None].to(dev)
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
            rows.append(out[0, ids.shape[1]:].cpu())
    return torch.stack(rows)
