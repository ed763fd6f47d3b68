// MLA decode on Hopper (sm_90a) with wgmma: dense BF16, sparse BF16 and sparse FP8-656.
//
// Same contract, CTA shape and split-KV pieces as the mma.sync kernels in decode/sm80.cuh (one CTA =
// 64 rows of a sequence × one part; pieces of split sequences go to the fp32 workspace and
// mla_decode_combine merges them), so the launcher only swaps the kernel, shared size and tile.
// Sparse differs in where a tile's tokens come from (the index list instead of the block table)
// and, for FP8, in how they arrive: the quad schedule's producer warpgroup (or trio's and pair's
// P·V warpgroups) dequantise them into the bf16 tiles (decode/sm90_trio.cuh, families of their
// own; this family is BF16 only).
// Files: sm90_base.cuh (layout, shared helpers), sm90_plain.cuh, sm90_roles.cuh,
// sm90_seesaw.cuh (the schedules), arch/sm90_ptx.cuh (the PTX wrappers); this file dispatches.
//
// Layout: Q (64 × 576) and each KV tile (Tile tokens × 576) sit in shared memory as 9 column
// blocks of 64 dims; in a block a token's 64 dims are one 128-byte row whose 16-byte chunks are
// XOR-swizzled by (row mod 8): the 128B-swizzle atom of wgmma. The same tile is K-major for
// S = Q·Kᵀ and MN-major (transposed B) for O += P·V, so V is never copied again.
// Warpgroup w owns O's columns 256w..256w+255 (128 fp32 registers per thread) and adds P·V
// with P rounded once to bf16 (docs/contract.md §9 bounds the error by 2^-8·A_c, A_c the softmax-weighted
// mean of |v|; the row sums l stay fp32). Warpgroup 0 computes S = Q·Kᵀ (64 × Tile, wgmma m64nTile from
// shared memory) and, with the roles schedule, the softmax; how the two warpgroups share the rest
// is the schedule (Sm90Schedule below). Loads are cp.async 16-byte copies (unread tokens
// zero-filled; a proxy fence orders them before the tensor cores read), except that the roles
// schedule loads whole dense tiles by TMA when the launch passes a tensor map.
// Where the time goes (ncu, NOTES.md): per 64-token tile ~3,200 cycles of tensor work and as
// many of shared-memory port traffic (S reads Q and K from shared memory), with warpgroup 0's
// softmax and P hand-over still on the critical path.
#pragma once
#include "decode/sm90_plain.cuh"
#include "decode/sm90_roles.cuh"
#include "decode/sm90_seesaw.cuh"

namespace dcp {

// The kernel family's entry: the schedule picks the body.
template <DecodeKv Kv, int Tile, int Stages, Sm90Schedule Sched>
__device__ __forceinline__ void mla_decode_sm90(const DcpMlaDecodeParams& p) {
    if constexpr (Sched == Sm90Schedule::Seesaw) mla_decode_sm90_seesaw<Kv, Tile, Stages>(p);
    else if constexpr (Sched == Sm90Schedule::Roles) mla_decode_sm90_roles<Kv, Tile, Stages>(p);
    else mla_decode_sm90_lockstep<Kv, Tile, Stages, Sched>(p);
}

}  // namespace dcp
