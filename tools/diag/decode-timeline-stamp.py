#!/usr/bin/env python3
"""Copies kernels-src into DST with globaltimer stamps in decode/sm90_trio.cuh, for
tools/diag/decode-timeline.cu (a measurement, not part of the library; NOTES.md at 628d1db, nineteenth and
twentieth sessions). Usage: decode-timeline-stamp.py KERNELS_SRC DST

Slots a CTA records (the harness prints each slot's spread over the CTAs):
  stamps, µs from the CTA's entry: 3/12 the scorer's first/last tile landed, 4 its first P handed
  over, 6 its loop's end; 10/11 P·V warpgroup 1's first/last P, 5 its first P·V done, 7 its loop's
  end, 8 its epilogue's end; lead (the producer schedule): 1 the scorer's copies of Q issued, 2 its first fill arrived, 9 its
  loop's end, and of its first piece: 20 the piece's entry (the kernel's set-up done), 16 its
  lengths read, 17 tile 0's index landed, 18 / 19 fill 0's batch 0 / batch 2 landed; sums: 21
  the scorer's waits for a tile, 22 the producer's waits for a free buffer, 23 its fills' time
  after that wait (to the fill's last arrival).
  sums over the CTA's tiles, µs (trio): 9 the scorer's waits for a tile; 13 / 14 P·V
  warpgroup 1's waits for P and for the tile.
Each anchor must match exactly once (or, where marked optional, not at all): when the kernel's
text moves on, this script fails rather than stamping the wrong place.
"""
import shutil
import sys

src, dst = sys.argv[1], sys.argv[2]
shutil.copytree(src, dst, dirs_exist_ok=True)
path = f"{dst}/decode/sm90_trio.cuh"
s = open(path).read()


def rep(a, b, optional=False, times=1):
    global s
    c = s.count(a)
    if c == 0 and optional:
        return
    if c != times:
        raise SystemExit(f"anchor found {c} times (not {times}): {a!r}")
    s = s.replace(a, b)


# the scorer: its waits for a tile (sum), first and last tile, first P, loop end
rep("                mbar_wait_sleep(full(b), (u >> 1) & 1);\n                if constexpr (kLead) {\n",
    "                const unsigned long long tl_w0 = DCP_NOW();\n"
    "                mbar_wait_sleep(full(b), (u >> 1) & 1);\n"
    "                if (t == 0 && !kLead) DCP_ACC(9, DCP_NOW() - tl_w0);\n"
    "                if (t == 0 && kLead) DCP_ACC(21, DCP_NOW() - tl_w0);\n"
    "                if (t == 0 && i == 0) DCP_TL(3);\n"
    "                if (t == 0 && i == n - 1) DCP_TL(12);\n"
    "                if constexpr (kLead) {\n")
# the scorer's P handed over (trio_split: its second half), and its loop's end (lead: after its
# own P·V of O's left half)
first_p = "                    if (t == 0 && i == 0) DCP_TL(4);\n"
for a in ("                    mbar_arrive(p_full(b));\n", "                    mbar_arrive(p_full(b, 1));\n"):
    rep(a, a + first_p)
a = "            }\n            // the rows' row_stats (den, lse)"
rep(a, "            }\n            if (t == 0) DCP_TL(6);\n" + a[len("            }\n"):])
# lead: the scorer's copies of Q issued; the producer's first fill arrived, its loop's end
rep("                    mbar_arrive_cp_async(q_full);  // one arrival a thread, once its copies land\n",
    "                    mbar_arrive_cp_async(q_full);  // one arrival a thread, once its copies land\n"
    "                    if (t == 0) DCP_TL(1);\n")
# (the loop both producers, FP8-656's and MODEL1's, run: `produce`)
rep("                if (f + 1 < n) next(f);\n",
    "                if (t == 0) DCP_ACC(23, DCP_NOW() - tl_e1);\n"
    "                if (t == 0 && f == 0) DCP_TL(2);\n                if (f + 1 < n) next(f);\n")
# lead's producer: its waits for a free buffer (sum), and each fill's time after that wait (sum)
rep("                if (u >= 2) mbar_wait_sleep(empty(b), ((u >> 1) - 1) & 1);  // P·V of use u − 2 is done\n",
    "                const unsigned long long tl_e0 = DCP_NOW();\n"
    "                if (u >= 2) mbar_wait_sleep(empty(b), ((u >> 1) - 1) & 1);  // P·V of use u − 2 is done\n"
    "                const unsigned long long tl_e1 = DCP_NOW();\n"
    "                if (t == 0) DCP_ACC(22, tl_e1 - tl_e0);\n")
rep("            uses += n;\n            __syncthreads();                // the scorer's sStats\n",
    "            if (t == 0) DCP_TL(9);\n            uses += n;\n            __syncthreads();                // the scorer's sStats\n")
# P·V warpgroup 1: its waits for P and for the tile (sums), first and last P, first P·V, loop end, end
stamps = ("                if (kRole == 1 && t == 0) DCP_ACC(13, DCP_NOW() - tl_p0);\n"
          "                if (kRole == 1 && t == 0 && i == 0) DCP_TL(10);\n"
          "                if (kRole == 1 && t == 0 && i == n - 1) DCP_TL(11);\n")
wait_p = "                mbar_wait_sleep(p_full(b, 0), (u >> 1) & 1);  // P(u) (trio_split: its first half) and its factors are written\n"
rep(wait_p, "                const unsigned long long tl_p0 = DCP_NOW();\n" + wait_p + stamps)
rep("                mbar_wait(full(b), (u >> 1) & 1);\n                fence_proxy_async();\n                if constexpr (kSplitP) {\n",
    "                const unsigned long long tl_f0 = DCP_NOW();\n"
    "                mbar_wait(full(b), (u >> 1) & 1);\n"
    "                if (kRole == 1 && t == 0) DCP_ACC(14, DCP_NOW() - tl_f0);\n"
    "                fence_proxy_async();\n                if constexpr (kSplitP) {\n")
a = "                mbar_arrive(empty(b));  // every thread: it read sAlpha, and its P·V is done\n"
rep(a, a + "                if (kRole == 1 && t == 0 && i == 0) DCP_TL(5);\n")
a = "            uses += n;\n            __syncthreads();  // the scorer's sStats\n            float2 stats[2];"
rep(a, "            if (kRole == 1 && t == 0) DCP_TL(7);\n" + a)
a = "stats, OHalf{o}, sKV, tid - 128, 256);\n"
rep(a, a + "            if (kRole == 1 && t == 0) DCP_TL(8);\n")
# lead's producer, its first piece's start (slots 16-20): piece entry (the kernel's set-up done),
# after its lengths (piece_tiles), tile 0's index landed (its row's prefetch uses it), fill 0's
# batch 0 and batch 2 landed (their first dequantising store uses them)
rep("        constexpr int kRole = decltype(role_tag)::value;  // = wg\n",
    "        constexpr int kRole = decltype(role_tag)::value;  // = wg\n"
    "        if (kRole == 3 && t == 0 && uses == 0) DCP_TL(20);\n")
# (FP8-656's producer, which the harness runs; MODEL1's keeps two threads a token)
rep("            decode::cp_async_wait<0>();  // the previous piece's copies, seen here",
    "            if (t == 0 && uses == 0) DCP_TL(16);\n"
    "            decode::cp_async_wait<0>();  // the previous piece's copies, seen here")
rep("            uint4 ra[kFp8Batch], rb[kFp8Batch];\n            float4 sc[2];\n",
    "            if (t == 0 && uses == 0) DCP_TL(17);\n"
    "            uint4 ra[kFp8Batch], rb[kFp8Batch];\n            float4 sc[2];\n")
rep("                    store_batch(ra, b, 0, sc[0]);\n",
    "                    store_batch(ra, b, 0, sc[0]);\n                    if (t == 0 && u == 0) DCP_TL(18);\n")
rep("                    store_batch(ra, b, 2, sc[1]);\n",
    "                    store_batch(ra, b, 2, sc[1]);\n                    if (t == 0 && u == 0) DCP_TL(19);\n")
open(path, "w").write(s)
print(f"stamped {path}")
