"""A minimal dcp_mla example that runs anywhere (no torch, no GPU): plan a DCP group of D = 4
ranks for 64 requests of 128K tokens, see where tokens live and what each rank holds.

    py=$(./scripts/python-venv.sh) && $py -m pip install . && $py python/examples/plan_group.py

python/tests/test_examples.py runs it.
"""

import dcp_mla

D, I, B = 4, 1, 64  # DCP size, interleave, tokens per page

p = dcp_mla.plan(context=131072, dcp_size=D, interleave=I, block_size=B, batch=64, num_q=2, local_heads=16,
                 kv_format="fp8_656")
print(f"H = D·H_l = {p.heads} heads; each rank holds {p.local_lens[0]} of 131072 tokens "
      f"({p.pages_per_request} pages a request, {p.cache_bytes_per_rank / 2**30:.2f} GiB for the batch)")
print(f"decode split-KV parts at 132 SMs: {p.decode_splits}, workspace bytes {p.decode_workspace_bytes}")

# token t lives on rank (t // I) % D, at local position (t // (D·I))·I + t % I
for t in (0, 1, 5, 1000):
    rank, column, slot = dcp_mla.token_address(t, D, I, B)
    print(f"token {t}: rank {rank}, block-table column {column}, slot {slot}")

# an MTP step: request lengths include their 2 new tokens; rows see a causal prefix
rows = dcp_mla.causal_local_lens([10, 7], [2, 2], D, I, 0)
print(f"rank 0's per-row lengths: {rows}")

# D must be one of the sizes the kernels are built for
try:
    dcp_mla.plan(context=4096, dcp_size=3, tp=6)
except dcp_mla.DcpMlaError as e:
    print(f"refused: {e.message}")
