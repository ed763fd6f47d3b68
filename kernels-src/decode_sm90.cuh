// MLA decode on Hopper (sm_90a) with wgmma: dense BF16, sparse BF16 and sparse FP8-656.
//
// Same contract, CTA shape and split-KV pieces as the mma.sync kernels in decode.cuh (one CTA =
// 64 rows of a sequence × one part; pieces of split sequences go to the fp32 workspace and
// mla_decode_combine merges them), so the launcher only swaps the kernel, shared size and tile.
// Sparse differs in where a tile's tokens come from (the index list instead of the block table)
// and, for FP8, in how they arrive: raw 656-byte rows are staged with cp.async and dequantised
// by the warp that copied them into the one bf16 tile (Stages = 1).
//
// Layout: Q (64 × 576) and each KV tile (Tile tokens × 576) sit in shared memory as 9 column
// blocks of 64 dims; in a block a token's 64 dims are one 128-byte row whose 16-byte chunks are
// XOR-swizzled by (row mod 8): the 128B-swizzle atom of wgmma. The same tile is K-major for
// S = Q·Kᵀ and MN-major (transposed B) for O += P·V, so V is never copied again.
// Warpgroup w owns O's columns 256w..256w+255 (128 fp32 registers per thread) and adds P·V
// with P rounded once to bf16 (SPEC §9 bounds the error by 2^-8·A_c, A_c the softmax-weighted
// mean of |v|; the row sums l stay fp32). Warpgroup 0 computes S = Q·Kᵀ (64 × Tile, wgmma m64nTile from
// shared memory) and, with the roles schedule, the softmax; how the two warpgroups share the rest
// is the schedule (Sm90Schedule below). Loads are cp.async 16-byte copies (unread tokens
// zero-filled; a proxy fence orders them before the tensor cores read), except that the roles
// schedule loads whole dense tiles by TMA when the launch passes a tensor map.
// Where the time goes (ncu, NOTES.md): per 64-token tile ~3,200 cycles of tensor work and as
// many of shared-memory port traffic (S reads Q and K from shared memory), with warpgroup 0's
// softmax and P hand-over still on the critical path.
#pragma once
#include "decode.cuh"

namespace dcp {

// Schedules of the wgmma kernel (the `schedule` axis of kernels.toml):
// Plain: warpgroups in lockstep, one CTA barrier per tile; warpgroup 0 computes S and hands its
//   fp32 fragments to warpgroup 1 (through the tile's rope block, free once S is done, and 8 KB
//   more); both run the softmax; all threads issue the loads Stages − 1 tiles ahead.
// Roles: warpgroup 0 computes S, the softmax and its half of P·V, queueing S of tile i behind
//   its P·V of tile i − 1; warpgroup 1 loads the tiles and does the other half of P·V with P
//   handed over through shared memory. Tiles and P are handed over by full/empty mbarriers,
//   so neither warpgroup waits for the other at a CTA barrier (BF16 only).
// Seesaw: the two warpgroups split each pair of tiles evenly: each computes S of one tile and
//   adds to its half of O the P·V of both, its own P from registers and the other's from shared
//   memory; dense BF16 tiles by TMA only (decode_sm90_seesaw.cuh).
// (A fourth, P·V left in flight across the next tile's barrier, was never faster: ptxas serialised
// its wgmma, C7514. codegen now rejects a hot kernel whose wgmma ptxas serialises.)
enum class Sm90Schedule { Plain, Roles, Seesaw };

namespace decode_sm90 {

constexpr int kThreads = 256;
constexpr int kRows = 64;
constexpr int kBlocks = kDimQk / 64;  // 9 column blocks of 64 dims
constexpr int kChunks = kDimQk / 8;   // 72 16-byte chunks per row

// Validity flags per token: a slot per ring buffer; FP8 keeps two (tile parity), as its next
// tile's raw copies (and flags) are issued while the current tile's softmax reads its flags.
template <DecodeKv Kv, int Stages>
constexpr int valid_slots() {
    return Kv == DecodeKv::SparseFp8 ? 2 : Stages;
}

// Dynamic shared memory (kernels.toml `dynamic_shared` evaluates it for the registry). The extra
// 1024 bytes let the kernel align its buffers to the 1024-byte swizzle period. FP8 adds one
// staging buffer of raw 656-byte rows.
// S shared between the warpgroups (plain schedule): warpgroup 0 computes S and hands its fp32
// fragments to warpgroup 1 through the current tile's rope block (Tile × 128 bytes, read by S
// only) and this many more bytes.
template <int Tile, Sm90Schedule Sched>
constexpr int s_share_extra_bytes() {
    return Sched == Sm90Schedule::Plain ? kRows * Tile * 4 - Tile * 128 : 0;
}

// Roles schedule (P itself goes to the tile's rope block): the rows' rescale factors, their
// final (l, m), and the full/empty mbarriers of the two buffers and of P's hand-over.
template <int Tile, Sm90Schedule Sched>
constexpr int roles_extra_bytes() {
    return Sched == Sm90Schedule::Roles ? kRows * 4 + kRows * 8 + 6 * 8 : 0;
}

// Seesaw schedule: the rows' running max, the pair's two scale factors, the two warpgroups' row
// sums, a token mask per buffer, and the mbarriers: a full one per column block of each buffer,
// four hand-overs, and one per warpgroup for its tail zeroing (decode_sm90_seesaw.cuh).
constexpr int kSeesawBars = 2 * kBlocks + 4 + 2;
constexpr int seesaw_extra_bytes() { return 3 * kRows * 4 + 2 * kRows * 4 + 2 * 8 + kSeesawBars * 8; }

template <DecodeKv Kv, int Tile, int Stages, Sm90Schedule Sched>
constexpr int shared_bytes() {
    if constexpr (Sched == Sm90Schedule::Seesaw) return 1024 + kRows * kDimQk * 2 + Stages * Tile * kDimQk * 2 + seesaw_extra_bytes();
    return 1024 + kRows * kDimQk * 2 + Stages * Tile * kDimQk * 2 + valid_slots<Kv, Stages>() * Tile * 4 +
           (Kv == DecodeKv::SparseFp8 && Sched != Sm90Schedule::Roles ? Tile * kFp8RowBytes : 0) +
           s_share_extra_bytes<Tile, Sched>() +
           roles_extra_bytes<Tile, Sched>();
}

// Byte offset of 16-byte chunk c (0..71) of row r in a [rows × 576] bf16 buffer of 9 blocks.
__device__ __forceinline__ uint32_t swizzled(int rows, int r, int c) {
    return (uint32_t)((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Matrix descriptor, 128B swizzle: start >> 4, leading byte offset >> 4 at bit 16, stride
// byte offset >> 4 at bit 32, layout 1 (SWIZZLE_128B) at bit 62.
__device__ __forceinline__ uint64_t make_desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) |
           (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Keeps the compiler from moving accesses of accumulator registers across wgmma fences/waits.
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// The CTA's dynamic shared memory, aligned to the 1024-byte swizzle period. A launch with less
// than the variant needs (shared_bytes) is a host/kernel mismatch, a bug: trap, so the launch
// fails loudly instead of leaving the outputs unwritten.
template <DecodeKv Kv, int Tile, int Stages, Sm90Schedule Sched>
__device__ __forceinline__ unsigned char* aligned_smem() {
    uint32_t dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < (uint32_t)shared_bytes<Kv, Tile, Stages, Sched>()) __trap();
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t raw_addr = decode::smem_addr(smem_raw);
    return smem_raw + (((raw_addr + 1023) & ~1023u) - raw_addr);
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// d[64×32] (+)= A·B, A and B K-major from shared memory (descriptors); acc = 0: d = A·B.
__device__ __forceinline__ void wgmma_ss_n32(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(desc_a), "l"(desc_b), "r"(acc));
}

// d[64×64] (+)= A·B, A and B K-major from shared memory (descriptors); acc = 0: d = A·B.
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(acc));
}

// d[64×64] = A·B (d is write-only: its old values need not be kept live), A and B K-major.
__device__ __forceinline__ void wgmma_ss_n64_first(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n"
        "}\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])
        : "l"(desc_a), "l"(desc_b));
}

// d[64×256] += A·B, A from registers (bf16 fragments), B MN-major from shared memory (transposed).
__device__ __forceinline__ void wgmma_rs_n256(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
}

// d[64×256] += A·B, A K-major and B MN-major (transposed) from shared memory.
__device__ __forceinline__ void wgmma_ss_n256(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(desc_a), "l"(desc_b), "n"(1));
}


template <int Tile>
__device__ __forceinline__ void wgmma_ss(float (&d)[Tile / 2], uint64_t da, uint64_t db, int acc = 1) {
    if constexpr (Tile == 32) wgmma_ss_n32(d, da, db, acc);
    else wgmma_ss_n64(d, da, db, acc);
}

// mbarriers of the roles schedule.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival (release: the thread's earlier shared-memory writes are seen by a waiter).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// One arrival once every cp.async this thread has issued so far has landed.
__device__ __forceinline__ void mbar_arrive_cp_async(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred done;\nWAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
// The tensor copy engine (TMA): `bytes` more are to land on `bar` in its current phase (the
// caller arrives on it afterwards, so the phase cannot complete before this is counted).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// One box of the 2-D tensor map `tmap` (a __grid_constant__ param) at column c0, row c1 into
// shared memory at dst (1024-byte aligned for the 128B swizzle), completing its bytes on bar.
// Boxes reaching outside the tensor fill zeros there and still complete all their bytes.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* tmap, int c0, int c1, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}
// A warpgroup's register budget, raised or lowered (all 128 threads; multiples of 8). The CTA's
// warpgroups share the SM's 64K registers: what one gives back another may take.
// A thread's first row in a warpgroup's 64-row accumulator (wgmma layout: warp w of the group
// holds rows 16w.., lane l rows l / 4 and l / 4 + 8).
__device__ __forceinline__ int row_of(int tid) { return ((tid >> 5) & 3) * 16 + ((tid & 31) >> 2); }

// Picks a role's piece body at compile time (the roles schedule's FP8 loader).
template <bool B>
struct LoaderTag {
    static constexpr bool value = B;
};
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Brings [src, src + bytes) into L2 (16-byte aligned, a multiple of 16 bytes): no registers, no wait.
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(reinterpret_cast<uint64_t>(src)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const void* tmap) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
}
__device__ __forceinline__ void wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }

// The online softmax's second half for two adjacent scores of a row: p = 2^(s − m_use), added in
// fp32 to the row's running sum l, and returned as the packed bf16 pair P·V multiplies (one
// rounding: SPEC §9's 2^-8·A_c).
__device__ __forceinline__ uint32_t p_bf16(float s0, float s1, float m_use, float& l) {
    const float p0 = exp2f(s0 - m_use), p1 = exp2f(s1 - m_use);
    l += p0 + p1;
    return decode::pack_bf16(p0, p1);
}

// P(i) as the K-major 128B-swizzled A operand of P·V, [64 rows × 64 tokens] bf16 at base (the
// layout of one column block of Q): k16 block kk.
__device__ __forceinline__ uint64_t p_desc(uint32_t base, int kk) { return make_desc(base + kk * 32, 16, 1024); }

// Roles schedule: O[64 × 256] += P·V over the 64-token tile at tile_addr, V = its dims
// 256·half.. (MN-major), P from shared memory (in the tile's rope block, which only S reads);
// issued and committed, not waited for.
template <int Tile>
__device__ __forceinline__ void issue_pv_half(float (&o)[128], uint32_t tile_addr, int half) {
    const uint32_t p_addr = tile_addr + (kBlocks - 1) * (Tile * 128);
    fence_regs(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Tile / 16; ++kk) {
        const uint64_t dv = make_desc(tile_addr + 4 * half * (Tile * 128) + kk * 16 * 128, Tile * 128, 1024);
        wgmma_ss_n256(o, p_desc(p_addr, kk), dv);
    }
    wgmma_commit();
}

// The online softmax's first half, shared by both schedules: masks a tile's scores (a token
// counts when its flag is set and it lies inside the row; a select, so a NaN score never
// survives), scales them to log2 units, and moves the thread's two rows' running max m_run:
// alpha is the factor the rows' earlier sums shrink by, m_use the max this tile's p are taken
// against (0 while a row has seen nothing, so p = 0 and no NaN). Rows r0, r0 + 8 of the warp's
// 16, columns 8j + 2t4 (+1).
template <int kSRegs, int Tile>
__device__ __forceinline__ void softmax_max(float (&s)[kSRegs], const int* valid, int tile, const int (&row_len)[2],
                                            int t4, float scale_log2, float (&m_run)[2], float (&l_run)[2],
                                            float (&alpha)[2], float (&m_use)[2]) {
    float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int e = 0; e < kSRegs; ++e) {
        const int col = 8 * (e >> 2) + 2 * t4 + (e & 1);
        const int k = (e >> 1) & 1;
        const bool ok = valid[col] && tile * Tile + col < row_len[k];
        s[e] = ok ? s[e] * scale_log2 : -INFINITY;
        tmax[k] = fmaxf(tmax[k], s[e]);
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        tmax[k] = fmaxf(tmax[k], __shfl_xor_sync(0xffffffffu, tmax[k], 1));
        tmax[k] = fmaxf(tmax[k], __shfl_xor_sync(0xffffffffu, tmax[k], 2));
        const float m_new = fmaxf(m_run[k], tmax[k]);
        m_use[k] = m_new == -INFINITY ? 0.0f : m_new;
        alpha[k] = exp2f(m_run[k] - m_use[k]);
        m_run[k] = m_new;
        l_run[k] *= alpha[k];
    }
}

// O ·= alpha per row (rows r0 and r0 + 8 of the thread's 128 accumulators). Once a row's running
// max settles (most tiles of a long row), alpha = 1: a warp whose 16 rows all keep their max
// skips the 128 multiplications.
__device__ __forceinline__ void rescale_o(float (&o)[128], float alpha0, float alpha1) {
    if (__any_sync(0xffffffffu, alpha0 != 1.0f || alpha1 != 1.0f)) {
#pragma unroll
        for (int n = 0; n < 32; ++n) {
            o[4 * n + 0] *= alpha0;
            o[4 * n + 1] *= alpha0;
            o[4 * n + 2] *= alpha1;
            o[4 * n + 3] *= alpha1;
        }
    }
}

// The sum of a row's value over the 4 lanes (t4) that hold its columns.
__device__ __forceinline__ float row_total(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

// Q's 64 rows (rows row_base.. of the sequence, row_limit of them; the rest zero-filled) into
// sQ, swizzled, by `threads` threads of which this is number `t`.
__device__ __forceinline__ void load_q(const DcpMlaDecodeParams& p, unsigned char* sQ, int64_t seq_row0, int row_base,
                                       int row_limit, int t, int threads) {
    for (int c = t; c < kRows * kChunks; c += threads) {
        const int r = c / kChunks, part = c % kChunks;
        const bool ok = r < row_limit;
        const __nv_bfloat16* src =
            (const __nv_bfloat16*)p.q + (ok ? (seq_row0 + row_base + r) * kDimQk + part * 8 : 0);
        decode::cp_async16(sQ + swizzled(kRows, r, part), src, ok);
    }
}

// Part `part` (of Parts) of cache row `row` (-1: zero-filled) as token `tok` of a swizzled
// [Tile × 576] tile: chunks part, part + Parts, ...
template <int Tile, int Parts>
__device__ __forceinline__ void copy_token(unsigned char* tile, int tok, int part, const DcpMlaDecodeParams& p,
                                           int64_t row) {
    const __nv_bfloat16* src = (const __nv_bfloat16*)p.cache + (row >= 0 ? row * kDimQk : 0);
#pragma unroll
    for (int k = 0; k < kChunks / Parts; ++k) {
        const int c = part + Parts * k;
        decode::cp_async16(tile + swizzled(Tile, tok, c), src + 8 * c, row >= 0);
    }
}

// This CTA's rows: rows base.. (limit of them) of sequence `seq` when the launch has one part
// (with several, for_each_piece picks the sequences). Sparse CTAs of one part hold a (query
// row, head block) pair in blockIdx.x, as in decode.cuh.
struct CtaRows {
    int seq, base, limit;
};
template <bool Sparse>
__device__ __forceinline__ CtaRows cta_rows(const DcpMlaDecodeParams& p, int seq_rows) {
    const int H = p.heads, nq = p.nq;
    const int hblocks = (H + kRows - 1) / kRows;
    const int rb = Sparse && p.num_splits <= 1 ? blockIdx.x % hblocks : blockIdx.x;
    const int seq = Sparse ? blockIdx.y * nq + blockIdx.x / hblocks : blockIdx.y;
    return CtaRows{seq, rb * kRows, min(kRows, seq_rows - rb * kRows)};
}
#endif

}  // namespace decode_sm90

// The plain (lockstep) schedule: both warpgroups meet at one CTA barrier per tile; see the
// file's head comment. Sparse FP8 runs only this one.
template <DecodeKv Kv, int Tile, int Stages, Sm90Schedule Sched>
__device__ __forceinline__ void mla_decode_sm90_lockstep(const DcpMlaDecodeParams& p) {
    [[maybe_unused]] constexpr bool kSparse = Kv != DecodeKv::DenseBf16;  // (unused off sm_90a)
    constexpr bool kFp8 = Kv == DecodeKv::SparseFp8;
    static_assert(Tile == 32 || Tile == 64, "S tile is one wgmma m64nTile");
    static_assert(kFp8 ? Stages == 1 : Stages >= 2, "a ring of at least two buffers (FP8: one, fed by dequant)");
    static_assert(decode_sm90::shared_bytes<Kv, Tile, Stages, Sched>() + decode::kWriteRowsStaticBytes <= 227 * 1024,
                  "fits one H100/H200 CTA (dynamic + write_rows' static flags)");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace decode_sm90;
    constexpr int kTilePerThread = kThreads / Tile;  // threads loading one token row
    static_assert(32 % kTilePerThread == 0, "a token's loading threads are lanes of one warp");
    constexpr int kSRegs = Tile / 2;
    unsigned char* smem = aligned_smem<Kv, Tile, Stages, Sched>();
    unsigned char* sQ = smem;
    unsigned char* sKV = smem + kRows * kDimQk * 2;  // Stages × [Tile × 576] bf16
    int* sValid = (int*)(sKV + Stages * Tile * kDimQk * 2);  // [valid_slots][Tile]
    unsigned char* sRaw = (unsigned char*)(sValid + valid_slots<Kv, Stages>() * Tile);  // FP8: [Tile][656]
    float4* sSx = (float4*)(sRaw + (kFp8 ? Tile * kFp8RowBytes : 0));  // the S hand-over beyond the rope block
    const uint32_t q_addr = decode::smem_addr(sQ), kv_addr = decode::smem_addr(sKV);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wr = warp & 3;  // warpgroup (V half), warp in the warpgroup (16 rows)
    const int g = lane >> 2, t4 = lane & 3;
    const int seqs = decode::num_seqs(p, kSparse), seq_rows = decode::rows_per_seq(p, kSparse);
    const CtaRows rows = cta_rows<kSparse>(p, seq_rows);
    const int block_seq = rows.seq, row_base = rows.base, row_limit = rows.limit;

    decode::for_each_piece(p, seqs, block_seq, [&](const decode::Piece pc) {
        __syncthreads();  // the previous piece is done with shared memory
        const int seq = pc.seq;
        const int64_t seq_row0 = (int64_t)seq * seq_rows;
        int row_len[2];  // this thread's rows g and g+8 of its warp's 16
        const int n_tokens = decode::piece_rows<kSparse>(p, seq, row_base, row_limit, wr * 16 + g, row_len);
        const int n_tiles = (n_tokens + Tile - 1) / Tile;
        const int tile_end = min(n_tiles, pc.tile_end);
        const int tile_begin = min(tile_end, pc.tile_begin);
        if (decode::skip_empty_share(p, pc, tile_begin, tile_end, seq_rows, row_base, row_limit, tid)) return;

        // ---- loads: Q once (in the first group), tiles Stages − 1 ahead ----
        load_q(p, sQ, seq_row0, row_base, row_limit, tid, kThreads);
        const int ld_tok = tid / kTilePerThread, ld_part = tid % kTilePerThread;
        // The block-table entry of token `tok` of `tile` (-1: past the sequence), and from it the
        // cache row (page·B + slot) or -1: unread. Split in two so the plain schedule can read the
        // entry one iteration before it issues the tile's copies: the table load's latency then
        // hides behind a tile of math instead of stalling every thread before the barrier.
        // Sparse: the "entry" is the index (page·B + slot) itself.
        auto token_page = [&](int tile, int tok) -> int {
            const int pos = tile * Tile + tok;
            if (pos >= n_tokens) return -1;
            if constexpr (kSparse) return ((const int32_t*)p.indices)[(int64_t)seq * p.topk + pos];
            return ((const int32_t*)p.block_table)[(int64_t)seq * p.block_table_stride + pos / p.block_size];
        };
        auto page_row = [&](int tile, int tok, int page) -> int64_t {
            const int pos = tile * Tile + tok;
            if constexpr (kSparse)
                return pos < n_tokens && page >= 0 && (int64_t)page < (int64_t)p.num_pages * p.block_size
                           ? (int64_t)page
                           : (int64_t)-1;
            return pos < n_tokens && page >= 0 && page < p.num_pages
                       ? (int64_t)page * p.block_size + pos % p.block_size
                       : (int64_t)-1;
        };
        auto token_row = [&](int tile, int tok) { return page_row(tile, tok, token_page(tile, tok)); };
        auto issue_tile_row = [&](int64_t row, int stage) {
            if (ld_part == 0) sValid[stage * Tile + ld_tok] = row >= 0;
            copy_token<Tile, kTilePerThread>(sKV + stage * (Tile * kDimQk * 2), ld_tok, ld_part, p, row);
        };
        auto issue_tile = [&](int tile, int stage) { issue_tile_row(token_row(tile, ld_tok), stage); };
        // FP8: a token's raw 656-byte row into the staging buffer (41 chunks over kTilePerThread
        // threads; unread tokens zero-filled, which dequantises to 0), its flag into `slot`.
        auto issue_raw_row = [&](int64_t row, int slot) {
            if (ld_part == 0) sValid[slot * Tile + ld_tok] = row >= 0;
            const unsigned char* src = (const unsigned char*)p.cache + (row >= 0 ? row * kFp8RowBytes : 0);
            unsigned char* dst = sRaw + ld_tok * kFp8RowBytes;
            for (int c = ld_part; c < kFp8RowBytes / 16; c += kTilePerThread)
                decode::cp_async16(dst + 16 * c, src + 16 * c, row >= 0);
        };
        // FP8: the staged raw tile → the bf16 tile, swizzled as the cp.async path writes it:
        // 64 chunks of 8 latent values (e4m3 × the group's power-of-two scale: exact in bf16)
        // and 8 chunks of bf16 rope copied.
        auto dequant_tile = [&]() {
            const unsigned char* raw = sRaw + ld_tok * kFp8RowBytes;
#pragma unroll
            for (int k = 0; k < kChunks / kTilePerThread; ++k) {
                const int c = ld_part + kTilePerThread * k;
                uint4 v;
                if (c < kDimLatent / 8) {
                    const float scale = *(const float*)(raw + kFp8ScaleOffset + 4 * (c / 16));
                    v = decode::dequant8(*(const uint2*)(raw + 8 * c), scale);
                } else {
                    v = *(const uint4*)(raw + kFp8RopeOffset + 16 * (c - kDimLatent / 8));
                }
                *(uint4*)(sKV + swizzled(Tile, ld_tok, c)) = v;
            }
        };
        if constexpr (kFp8) {
            if (tile_begin < tile_end) issue_raw_row(token_row(tile_begin, ld_tok), 0);
            decode::cp_async_commit();
        } else {
#pragma unroll
            for (int s = 0; s < Stages - 1; ++s) {
                if (tile_begin + s < tile_end) issue_tile(tile_begin + s, s);
                decode::cp_async_commit();
            }
        }

        const float scale_log2 = p.scale_log2;
        float o[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] = 0.0f;
        float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

        // plain schedule: the table entry of the next tile to issue, read an iteration ahead
        int next_page = token_page(tile_begin + (kFp8 ? 1 : Stages - 1), ld_tok);
        for (int tile = tile_begin; tile < tile_end; ++tile) {
            const int i = tile - tile_begin, stage = i % Stages;
            const int vslot = kFp8 ? (i & 1) : stage;
            if constexpr (kFp8) {
                // Raw tile i landed. A token's raw row is copied and dequantised by the same
                // kTilePerThread (4) consecutive lanes of one warp, so a warp barrier orders the
                // copies before the dequant and the dequant's reads before the next copies. The
                // bf16 tile was last read by P·V of tile i − 1, which ended in a CTA barrier; the
                // proxy fence and barrier below publish the dequantised tile to wgmma.
                decode::cp_async_wait<0>();
                __syncwarp();
                dequant_tile();
                __syncwarp();
                if (tile + 1 < tile_end) issue_raw_row(page_row(tile + 1, ld_tok, next_page), (i + 1) & 1);
                next_page = token_page(tile + 2, ld_tok);
                decode::cp_async_commit();
            } else {
                // tile i's group is the oldest of the Stages − 1 in flight
                decode::cp_async_wait<Stages - 2>();
            }
            fence_proxy_async();  // this thread's cp.async writes, before wgmma reads them
            __syncthreads();
            if constexpr (!kFp8) {
                // Every warp is past iteration i − 1 (the barrier above), so the buffer it read,
                // (i − 1) mod Stages, is free: refill it here, and the plain schedule needs no
                // second barrier at the end of the tile.
                if (tile + Stages - 1 < tile_end)
                    issue_tile_row(page_row(tile + Stages - 1, ld_tok, next_page), (i + Stages - 1) % Stages);
                next_page = token_page(tile + Stages, ld_tok);  // used next iteration
                decode::cp_async_commit();
            }
            const uint32_t tile_addr = kv_addr + stage * (Tile * kDimQk * 2);

            // ---- score: S[64 × Tile] = Q·Kᵀ, both operands K-major ----
            // Plain schedule: warpgroup 0 alone computes S (the tensor cores' shared-memory reads
            // of Q and K are then not doubled) and hands its fragments to warpgroup 1, whose
            // threads own the same rows and columns: thread t's 16-byte group q goes to float4
            // q·128 + t of the rope block (free once S is done) or of sSx, conflict-free.
            float s[kSRegs];
#pragma unroll
            for (int e = 0; e < kSRegs; ++e) s[e] = 0.0f;
            if (wg == 0) {
                fence_regs(s);
                wgmma_fence();
#pragma unroll
                for (int ks = 0; ks < kDimQk / 16; ++ks) {
                    const uint32_t koff = (ks & 3) * 32;
                    const uint64_t da = make_desc(q_addr + (ks >> 2) * (kRows * 128) + koff, 16, 1024);
                    const uint64_t db = make_desc(tile_addr + (ks >> 2) * (Tile * 128) + koff, 16, 1024);
                    wgmma_ss<Tile>(s, da, db);
                }
                wgmma_commit();
            }
            wgmma_wait0();
            fence_regs(s);
            {
                float4* rope = (float4*)(sKV + stage * (Tile * kDimQk * 2) + (kBlocks - 1) * (Tile * 128));
                const int t = tid & 127;
                auto slot = [&](int q) { return q < kSRegs / 8 ? rope + q * 128 + t : sSx + (q - kSRegs / 8) * 128 + t; };
                if (wg == 0) {
#pragma unroll
                    for (int q = 0; q < kSRegs / 4; ++q) *slot(q) = make_float4(s[4 * q], s[4 * q + 1], s[4 * q + 2], s[4 * q + 3]);
                }
                __syncthreads();
                if (wg == 1) {
#pragma unroll
                    for (int q = 0; q < kSRegs / 4; ++q) {
                        const float4 v = *slot(q);
                        s[4 * q] = v.x;
                        s[4 * q + 1] = v.y;
                        s[4 * q + 2] = v.z;
                        s[4 * q + 3] = v.w;
                    }
                }
            }

            // ---- softmax: each thread holds rows g, g+8 of its warp's 16 rows, columns 8j + 2t4 (+1) ----
            float alpha[2], m_use[2];
            softmax_max<kSRegs, Tile>(s, sValid + vslot * Tile, tile, row_len, t4, scale_log2, m_run, l_run, alpha, m_use);
            // P as A fragments of m64k16 (the accumulator layout of S, two n8 blocks per k16 block)
            uint32_t p_frag[Tile / 16][4];
#pragma unroll
            for (int e = 0; e < kSRegs; e += 2) {
                const int k = (e >> 1) & 1;
                // e = 8kk + 4h + 2k: k16 block kk, n8 half h, row half k → register 2h + k
                const int kk = e >> 3, reg = 2 * ((e >> 2) & 1) + k;
                p_frag[kk][reg] = p_bf16(s[e], s[e + 1], m_use[k], l_run[k]);
            }
            rescale_o(o, alpha[0], alpha[1]);

            // ---- accumulate: O[64 × 256] += P·V, V = dims 256wg.. of the tile, MN-major ----
            fence_regs(o);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < Tile / 16; ++kk) {
                // 4 blocks of 64 dims (leading byte offset: one block), 2 groups of 8 tokens (stride 1024)
                const uint64_t dv = make_desc(tile_addr + (4 * wg) * (Tile * 128) + kk * 16 * 128, Tile * 128, 1024);
                wgmma_rs_n256(o, p_frag[kk], dv);
            }
            wgmma_commit();
            wgmma_wait0();
            fence_regs(o);
            // FP8: the next tile is dequantised into this one bf16 tile before any barrier
            if constexpr (kFp8) __syncthreads();
        }
        decode::cp_async_wait<0>();

        // ---- write: O / l and lse = (m + log2 l)·ln 2; a row that saw nothing: 0 and −inf ----
        const float l_row[2] = {row_total(l_run[0]), row_total(l_run[1])};
        decode::write_rows(p, pc.slot, seq_row0, seq_rows, row_base, row_limit, wr * 16 + g, wg * 256 + 2 * t4,
                           wg == 0 && t4 == 0, l_row, m_run, [&](int n, int e) { return o[4 * n + e]; });
    });
#elif defined(__CUDA_ARCH__)
    __trap();  // sm_90a only: the launcher never picks this family elsewhere
#endif
}

// The roles schedule (Sm90Schedule::Roles; BF16 tiles of 64 tokens in two buffers).
// Warpgroup 0, per tile i: queue its half of P·V(i − 1) and S(i) back to back; once P·V is done
// (tile i − 1's buffer is then free for warpgroup 1 to refill) and S(i) is, the softmax; then P(i)
// as bf16 (into the tile's rope block, which only S reads), in the K-major swizzled layout of a
// wgmma A operand, plus the rows' rescale factors (sAlpha), for both warpgroups' P·V. Warpgroup 1: the loads (Q with the first tile; dense tiles by TMA when the
// launch passes a tensor map, else cp.async) and the other half of P·V, issued as soon as P(i)
// is handed over, so it runs beside warpgroup 0's S(i + 1). Buffer b's full mbarrier completes
// when its copies have landed (128 asynchronous cp.async arrivals, and the TMA boxes' bytes)
// and its validity flags are written (128 arrivals); its empty mbarrier when the 8 warps have
// finished P·V of it (S finished earlier). P's hand-over has two mbarriers too: p_full (128
// arrivals of warpgroup 0 once P(i) and the factors are written) and p_empty (128 of warpgroup
// 1 once its P·V(i) is done with them). mbarriers rather than named barriers also let
// racecheck see the hand-over (it reports data passed across bar.arrive/bar.sync as races).
template <DecodeKv Kv, int Tile, int Stages>
__device__ __forceinline__ void mla_decode_sm90_roles(const DcpMlaDecodeParams& p) {
    [[maybe_unused]] constexpr bool kSparse = Kv != DecodeKv::DenseBf16;  // (unused off sm_90a)
    constexpr Sm90Schedule Sched = Sm90Schedule::Roles;
    constexpr bool kFp8 = Kv == DecodeKv::SparseFp8;
    static_assert(Tile == 64 && Stages == 2, "roles schedule: P fills a 64-token rope block; two buffers");
    static_assert(decode_sm90::shared_bytes<Kv, Tile, Stages, Sched>() + decode::kWriteRowsStaticBytes <= 227 * 1024,
                  "fits one H100/H200 CTA (dynamic + write_rows' static flags)");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace decode_sm90;
    constexpr int kSRegs = Tile / 2;
    constexpr int kTileBytes = Tile * kDimQk * 2;
    constexpr int kLdPerTok = 128 / Tile;  // warpgroup 1's threads per token of a tile
    unsigned char* smem = aligned_smem<Kv, Tile, Stages, Sched>();
    unsigned char* sQ = smem;
    unsigned char* sKV = smem + kRows * kDimQk * 2;       // 2 × [Tile × 576] bf16
    int* sValid = (int*)(sKV + Stages * kTileBytes);      // [2][Tile]
    float* sAlpha = (float*)(sValid + Stages * Tile);     // [64] rescale factors of P(i)
    float2* sStats = (float2*)(sAlpha + kRows);           // [64] final (l, m) of the rows
    const uint32_t bars = decode::smem_addr(sStats + kRows);  // full[2], empty[2], p_full, p_empty
    auto full = [&](int b) { return bars + 8 * b; };
    auto empty = [&](int b) { return bars + 16 + 8 * b; };
    const uint32_t p_full = bars + 32, p_empty = bars + 40;
    const uint32_t q_addr = decode::smem_addr(sQ), kv_addr = decode::smem_addr(sKV);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wr = warp & 3, t = tid & 127;
    const int g = lane >> 2, t4 = lane & 3;
    if (tid == 0) {
        for (int b = 0; b < 2; ++b) {
            mbar_init(full(b), 256);
            mbar_init(empty(b), 8);
        }
        // one arrival per thread: racecheck does not see a warp's accesses ordered by __syncwarp
        // before lane 0's arrival (one arrival per warp measured no faster, NOTES.md)
        mbar_init(p_full, 128);
        mbar_init(p_empty, 128);
        fence_proxy_async();
    }
    if (!kSparse && p.kv_tma != 0 && tid == 128) tma_prefetch_map(&p.kv_tmap);  // warpgroup 1 issues the boxes
    const int seqs = decode::num_seqs(p, kSparse), seq_rows = decode::rows_per_seq(p, kSparse);
    const CtaRows rows = cta_rows<kSparse>(p, seq_rows);
    const int block_seq = rows.seq, row_base = rows.base, row_limit = rows.limit;
    const int r0 = wr * 16 + g;  // this thread's rows r0 and r0 + 8
    uint32_t uses = 0;           // tiles consumed before this piece: buffer uses & 1, phase uses >> 1

    // One piece of this CTA's work: by the math warpgroups (loader_tag false), or for FP8 by the
    // loader warpgroup (true), which runs its own piece loop under its own register budget.
    auto piece = [&](const decode::Piece pc, auto loader_tag) {
        constexpr bool kLoader = decltype(loader_tag)::value;
        __syncthreads();  // the previous piece is done with shared memory (and the mbarriers are set up)
        const int seq = pc.seq;
        const int64_t seq_row0 = (int64_t)seq * seq_rows;
        int row_len[2];
        const int n_tokens = decode::piece_rows<kSparse>(p, seq, row_base, row_limit, r0, row_len);
        const int n_tiles = (n_tokens + Tile - 1) / Tile;
        const int tile_end = min(n_tiles, pc.tile_end);
        const int tile_begin = min(tile_end, pc.tile_begin);
        if (decode::skip_empty_share(p, pc, tile_begin, tile_end, seq_rows, row_base, row_limit, tid)) return;
        const int n = tile_end - tile_begin;

        // ---- the loader's view of a tile (warpgroup 1; FP8: warpgroup 2) ----
        const int ld_tok = t / kLdPerTok, ld_part = t % kLdPerTok;
        // Dense: a power-of-two block size (the usual case) divides by shifting; the integer
        // division the general case needs costs warpgroup 1 more than its whole refill.
        const int bs = p.block_size, bs_log = 31 - __clz(bs);
        const bool bs_pow2 = (bs & (bs - 1)) == 0;
        auto div_bs = [&](int pos) { return bs_pow2 ? pos >> bs_log : pos / bs; };
        auto mod_bs = [&](int pos) { return bs_pow2 ? pos & (bs - 1) : pos % bs; };
        auto token_page = [&](int tile) -> int {
            const int pos = tile * Tile + ld_tok;
            if (pos >= n_tokens) return -1;
            if constexpr (kSparse) return ((const int32_t*)p.indices)[(int64_t)seq * p.topk + pos];
            return ((const int32_t*)p.block_table)[(int64_t)seq * p.block_table_stride + div_bs(pos)];
        };
        // the cache row of tile's token ld_tok, or -1 (past the sequence, or an invalid page)
        auto token_row = [&](int tile, int page) -> int64_t {
            const int pos = tile * Tile + ld_tok;
            if constexpr (kSparse) {
                if (pos < n_tokens && page >= 0 && (int64_t)page < (int64_t)p.num_pages * bs) return page;
            } else {
                if (pos < n_tokens && page >= 0 && page < p.num_pages) return (int64_t)page * bs + mod_bs(pos);
            }
            return -1;
        };
        uint32_t fills = uses;
        // fill f reuses the buffer of use f − 2: wait until its P·V is done
        auto wait_free = [&](uint32_t f) {
            if (f >= 2) mbar_wait(empty(f & 1), ((f >> 1) - 1) & 1);
        };

        if constexpr (kLoader) {
            // ---- FP8: the loader warpgroup (gather, dequantise, hand over) ----
            // A token's raw 656-byte row into registers, two threads a token (part h: latent
            // bytes [256h, 256h + 256), the scales of groups 2h and 2h + 1, rope values [32h,
            // 32h + 32)); zeros for an unread token (they dequantise to 0).
            struct Fp8Raw {
                uint4 lat[16], rope[4];
                uint2 scale;
            };
            auto gather = [&](Fp8Raw& r, int64_t row) {
                const unsigned char* src = (const unsigned char*)p.cache + (row >= 0 ? row : 0) * kFp8RowBytes;
#pragma unroll
                for (int j = 0; j < 16; ++j)
                    r.lat[j] = row >= 0 ? __ldg((const uint4*)(src + 256 * ld_part + 16 * j)) : make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    r.rope[j] = row >= 0 ? __ldg((const uint4*)(src + kFp8RopeOffset + 64 * ld_part + 16 * j))
                                         : make_uint4(0, 0, 0, 0);
                r.scale = row >= 0 ? __ldg((const uint2*)(src + kFp8ScaleOffset + 8 * ld_part)) : make_uint2(0, 0);
            };
            // The gathered row dequantised into buffer b (e4m3 × the group's power-of-two scale,
            // exact in bf16), swizzled as the BF16 copies land; then the two arrivals (the
            // cp.async one covers Q's copies with the first tile). The proxy fence makes these
            // generic-proxy writes visible to wgmma.
            auto fill_fp8 = [&](const Fp8Raw& r, int64_t row, int b) {
                if (ld_part == 0) sValid[b * Tile + ld_tok] = row >= 0;
                unsigned char* dst = sKV + b * kTileBytes;
                const float s0 = __uint_as_float(r.scale.x), s1 = __uint_as_float(r.scale.y);
#pragma unroll
                for (int j = 0; j < 16; ++j) {
                    const int c = 32 * ld_part + 2 * j;
                    const float sc = j < 8 ? s0 : s1;
                    *(uint4*)(dst + swizzled(Tile, ld_tok, c)) = decode::dequant8(make_uint2(r.lat[j].x, r.lat[j].y), sc);
                    *(uint4*)(dst + swizzled(Tile, ld_tok, c + 1)) =
                        decode::dequant8(make_uint2(r.lat[j].z, r.lat[j].w), sc);
                }
#pragma unroll
                for (int j = 0; j < 4; ++j) *(uint4*)(dst + swizzled(Tile, ld_tok, 64 + 4 * ld_part + j)) = r.rope[j];
                fence_proxy_async();
                mbar_arrive_cp_async(full(b));
                mbar_arrive(full(b));
            };
            // Per tile: the next tile's rows are sent to L2 (no registers), this tile's rows
            // are gathered (from L2 but for the first), then the buffer is awaited and filled:
            // the gather's latency runs while the buffer's last P·V finishes.
            int page = token_page(tile_begin);
            for (int k = 0; k < n; ++k) {
                if (k == 0) load_q(p, sQ, seq_row0, row_base, row_limit, t, 128);
                const int64_t row = token_row(tile_begin + k, page);
                page = token_page(tile_begin + k + 1);
                const int64_t ahead = token_row(tile_begin + k + 1, page);
                if (ahead >= 0)
                    prefetch_l2((const unsigned char*)p.cache + ahead * kFp8RowBytes + 336 * ld_part,
                                ld_part == 0 ? 336 : 320);  // this thread's 21 or 20 of the row's 41 chunks
                Fp8Raw r;
                gather(r, row);
                wait_free(fills);
                fill_fp8(r, row, fills & 1);
                ++fills;
            }
            uses += n;
            __syncthreads();                // the math warpgroups' end of the piece
            decode::write_rows_barriers();  // the loader holds no rows
            return;
        }

        float o[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] = 0.0f;
        float m_run[2] = {-INFINITY, -INFINITY}, l_row[2] = {0.0f, 0.0f};

        if (wg == 1) {
            // ---- the right half of P·V, and for BF16 the loads ----
            // Dense tiles wholly inside the sequence load by TMA when the launch passed a tensor
            // map: boxes of box_rows tokens (one page's worth, or 64 of one page) × 64 columns,
            // each issued by the thread holding its first token (whose page lookup it is); an
            // invalid page's box points past the cache's last row and fills zeros. Other tiles
            // (the sequence's last, partial one; sparse) go by cp.async with zero fill.
            const bool tma = !kSparse && p.kv_tma != 0;
            const int box_rows = min(Tile, bs);  // as the launcher encoded the map's box
            // tile's token ld_tok into buffer b: its flag, its share of the copies, two arrivals
            // (the cp.async one also covers Q's copies with the first tile)
            auto fill = [&](int tile, int page, int b) {
                const int64_t row = token_row(tile, page);
                if (ld_part == 0) sValid[b * Tile + ld_tok] = row >= 0;
                if (tma && (tile + 1) * Tile <= n_tokens) {
                    if (ld_part == 0 && (ld_tok & (box_rows - 1)) == 0) {
                        const int c1 = row >= 0 ? (int)row : p.num_pages * bs;
                        const uint32_t dst = kv_addr + b * kTileBytes + ld_tok * 128;
                        mbar_expect_tx(full(b), kBlocks * box_rows * 128);
#pragma unroll
                        for (int blk = 0; blk < kBlocks; ++blk)
                            tma_load_2d(dst + blk * (Tile * 128), &p.kv_tmap, blk * 64, c1, full(b));
                    }
                } else {
                    copy_token<Tile, kLdPerTok>(sKV + b * kTileBytes, ld_tok, ld_part, p, row);
                }
                mbar_arrive_cp_async(full(b));
                mbar_arrive(full(b));
            };
            // the next fill's page (the block-table load is issued a fill ahead)
            [[maybe_unused]] int page = -1;
            if constexpr (!kFp8) {
                page = token_page(tile_begin);
                for (int k = 0; k < 2 && k < n; ++k) {
                    wait_free(fills);
                    if (k == 0) load_q(p, sQ, seq_row0, row_base, row_limit, t, 128);
                    fill(tile_begin + k, page, fills & 1);  // tile 0's arrivals also cover Q
                    page = token_page(tile_begin + k + 1);
                    ++fills;
                }
            }
            for (int i = 0; i < n; ++i) {
                const uint32_t u = uses + i;
                const int b = u & 1;
                mbar_wait(p_full, u & 1);  // P(u) and its factors are written
                rescale_o(o, sAlpha[r0], sAlpha[r0 + 8]);
                mbar_wait(full(b), (u >> 1) & 1);  // landed long ago: this is the acquire
                fence_proxy_async();
                issue_pv_half<Tile>(o, kv_addr + b * kTileBytes, 1);
                wgmma_wait0();
                fence_regs(o);
                mbar_arrive(p_empty);  // done with sAlpha (P is in the tile, freed by empty(b))
                __syncwarp();
                if (lane == 0) mbar_arrive(empty(b));
                if constexpr (!kFp8) {
                    if (i + 2 < n) {
                        wait_free(fills);
                        fill(tile_begin + i + 2, page, fills & 1);
                        page = token_page(tile_begin + i + 3);
                        ++fills;
                    }
                }
            }
        } else {
            // ---- S, softmax and the left half of P·V ----
            // Per tile i ≥ 1: P·V(i − 1) and S(i) are queued back to back; the wait for P·V
            // frees tile i − 1's buffer (warpgroup 1 refills it with tile i + 1 while S(i) and the
            // softmax run); then S(i)'s softmax and P(i)'s hand-over. Each iteration waits for
            // all it issued: no wgmma is in flight across the loop's back edge, which ptxas would
            // answer by serialising every wgmma (C7514/C7515).
            const float scale_log2 = p.scale_log2;
            float l_run[2] = {0.0f, 0.0f}, alpha[2] = {1.0f, 1.0f};
            // S(tile i, in buffer b) into s, issued and committed (not waited for)
            auto issue_s = [&](float (&s)[kSRegs], int b) {
                // Q's address through an opaque copy: else the compiler computes Q's 36 descriptors
                // once, outside the tile loop, and spills them.
                uint32_t qa;
                asm volatile("mov.b32 %0, %1;" : "=r"(qa) : "r"(q_addr));
                const uint32_t tile_addr = kv_addr + b * kTileBytes;
                wgmma_fence();
#pragma unroll
                for (int ks = 0; ks < kDimQk / 16; ++ks) {
                    const uint32_t koff = (ks & 3) * 32;
                    const uint64_t da = make_desc(qa + (ks >> 2) * (kRows * 128) + koff, 16, 1024);
                    const uint64_t db = make_desc(tile_addr + (ks >> 2) * (Tile * 128) + koff, 16, 1024);
                    if (ks == 0) wgmma_ss_n64_first(s, da, db);
                    else wgmma_ss_n64(s, da, db, 1);
                }
                wgmma_commit();
                fence_regs(s);
            };
            // O_L ·= alpha (of the P about to be added), then P·V over tile (buffer b)'s left half
            auto issue_pv = [&](int b) {
                rescale_o(o, alpha[0], alpha[1]);
                issue_pv_half<Tile>(o, kv_addr + b * kTileBytes, 0);
                fence_regs(o);
            };
            // S(i) is done: softmax; P(i) (into tile i's rope block) and alpha handed to warpgroup
            // 1. Needs warpgroup 1's P·V(i − 1) done with sAlpha.
            auto softmax_hand_over = [&](float (&s)[kSRegs], int i, int b) {
                float m_use[2];
                softmax_max<kSRegs, Tile>(s, sValid + b * Tile, tile_begin + i, row_len, t4, scale_log2, m_run, l_run,
                                          alpha, m_use);
                // warpgroup 1's P·V of the previous tile (maybe of the previous piece) is done with
                // sAlpha
                const uint32_t u = uses + i;
                if (u > 0) mbar_wait(p_empty, (u - 1) & 1);
                unsigned char* p_dst = sKV + b * kTileBytes + (kBlocks - 1) * (Tile * 128);
                // The thread's place in P, from a fresh read of its index: else the compiler hoists
                // all 32 store addresses out of the tile loop and spills them.
                const int tv = decode::thread_index(), gv = (tv & 31) >> 2;
                const uint32_t row_off = (uint32_t)(((tv >> 5) & 3) * 16 + gv) * 128 + 4 * (tv & 3);
#pragma unroll
                for (int e = 0; e < kSRegs; e += 2) {
                    const int k = (e >> 1) & 1;
                    // columns 8(e >> 2) + 2t4, +1 of row r0 + 8k: 16-byte chunk e >> 2, swizzled by
                    // the row mod 8 (= g for both rows)
                    const uint32_t off = row_off + k * 1024 + (((e >> 2) ^ gv) << 4);
                    *(uint32_t*)(p_dst + off) = p_bf16(s[e], s[e + 1], m_use[k], l_run[k]);
                }
                if (t4 == 0) {
                    sAlpha[r0] = alpha[0];
                    sAlpha[r0 + 8] = alpha[1];
                }
                fence_proxy_async();  // these writes, before either warpgroup's wgmma reads them
                mbar_arrive(p_full);
                // all 64 rows written, before this warpgroup's own P·V reads them: p_full counts
                // exactly warpgroup 0's 128 threads (a named barrier of 128 threads here made
                // racecheck lose track of the CTA barriers)
                mbar_wait(p_full, u & 1);
            };
            if (n > 0) {
                {
                    const int b = uses & 1;
                    float s[kSRegs];
                    mbar_wait(full(b), (uses >> 1) & 1);
                    fence_proxy_async();
                    issue_s(s, b);
                    wgmma_wait0();
                    fence_regs(s);
                    softmax_hand_over(s, 0, b);
                }
                for (int i = 1; i < n; ++i) {
                    const uint32_t u = uses + i;
                    const int b = u & 1;
                    float s[kSRegs];
                    issue_pv(b ^ 1);
                    mbar_wait(full(b), (u >> 1) & 1);
                    fence_proxy_async();
                    issue_s(s, b);
                    wgmma_wait1();  // P·V(i − 1) is done: its buffer may be refilled
                    fence_regs(o);
                    __syncwarp();
                    if (lane == 0) mbar_arrive(empty(b ^ 1));
                    wgmma_wait0();
                    fence_regs(s);
                    softmax_hand_over(s, i, b);
                }
                issue_pv((uses + n - 1) & 1);
                wgmma_wait0();
                fence_regs(o);
                __syncwarp();
                if (lane == 0) mbar_arrive(empty((uses + n - 1) & 1));
            }
            // the rows' place in sStats from a fresh read of the thread index: else its address
            // lives from the kernel's start to here and spills under the FP8 kernel's budget
            const int rs = decode_sm90::row_of(decode::thread_index());
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                l_row[k] = row_total(l_run[k]);
                if (t4 == 0) sStats[rs + 8 * k] = make_float2(l_row[k], m_run[k]);
            }
        }
        uses += n;

        // ---- write: warpgroup 1 takes the rows' (l, m) from warpgroup 0 ----
        __syncthreads();
        if (wg == 1) {
            const int rs = decode_sm90::row_of(decode::thread_index());
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                const float2 v = sStats[rs + 8 * k];
                l_row[k] = v.x;
                m_run[k] = v.y;
            }
        }
        decode::write_rows(p, pc.slot, seq_row0, seq_rows, row_base, row_limit, r0, wg * 256 + 2 * t4,
                           wg == 0 && t4 == 0, l_row, m_run, [&](int c, int e) { return o[4 * c + e]; });
    };
    if constexpr (kFp8) {
        // 384 threads start at 168 registers each (64K / 384, in steps of 8), and the CTA's
        // pool is exactly that: what the math warpgroups take the loader must give back first,
        // or setmaxnreg.inc waits forever. The loader holds one tile's rows (82 registers)
        // beside its addresses; the math warpgroups hold half of O each (warpgroup 0 S
        // besides). 120 + 2·192 = 3·168 (a loader of 112 or 96 spilled). Each role runs its
        // own piece loop, so no code is shared between budgets.
        constexpr int kLaunchRegs = 65536 / 384 / 8 * 8, kLoaderRegs = 120, kMathRegs = 192;
        static_assert(kLoaderRegs + 2 * kMathRegs <= 3 * kLaunchRegs, "setmaxnreg must stay inside the CTA's pool");
        if (wg == 2) {
            setmaxnreg_dec<kLoaderRegs>();
            decode::for_each_piece(p, seqs, block_seq, [&](const decode::Piece pc) { piece(pc, LoaderTag<true>{}); });
            return;
        }
        setmaxnreg_inc<kMathRegs>();
    }
    decode::for_each_piece(p, seqs, block_seq, [&](const decode::Piece pc) { piece(pc, LoaderTag<false>{}); });
#elif defined(__CUDA_ARCH__)
    __trap();  // sm_90a only: the launcher never picks this family elsewhere
#endif
}

// The FP8 roles kernel's entry (its own family: 384 threads, a third warpgroup gathers and
// dequantises; NOTES.md, sixth session).
template <int Unused = 0>
__device__ __forceinline__ void mla_decode_sm90_fp8_roles(const DcpMlaDecodeParams& p) {
    mla_decode_sm90_roles<DecodeKv::SparseFp8, 64, 2>(p);
}

}  // namespace dcp

#include "decode_sm90_seesaw.cuh"

namespace dcp {

// The kernel family's entry: the schedule picks the body.
template <DecodeKv Kv, int Tile, int Stages, Sm90Schedule Sched>
__device__ __forceinline__ void mla_decode_sm90(const DcpMlaDecodeParams& p) {
    if constexpr (Sched == Sm90Schedule::Seesaw) mla_decode_sm90_seesaw<Kv, Tile, Stages>(p);
    else if constexpr (Sched == Sm90Schedule::Roles) mla_decode_sm90_roles<Kv, Tile, Stages>(p);
    else mla_decode_sm90_lockstep<Kv, Tile, Stages, Sched>(p);
}

}  // namespace dcp
