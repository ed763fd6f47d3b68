#!/usr/bin/env python3
"""Copies kernels-src into DST with globaltimer stamps in topk.cuh's topk_merge, for
tools/diag/topk-merge-timeline.cu (a measurement, not part of the library; NOTES.md at 628d1db, twenty-second
session). Usage: topk-merge-stamp.py KERNELS_SRC DST

Slots thread 0 of a CTA records (µs from its entry, which the harness stamps as slot 0): 1 the
valid count done (the loads have landed: the count reads every key), 2 the radix passes done,
3 the emission done; slot 8 counts the passes run. Each anchor must match exactly once: when the
kernel's text moves on, this script fails rather than stamping the wrong place.
"""
import shutil
import sys

src, dst = sys.argv[1], sys.argv[2]
shutil.copytree(src, dst, dirs_exist_ok=True)
path = f"{dst}/topk.cuh"
text = open(path).read()
# only topk_merge's text is stamped (its anchors may recur in the other kernels)
start = text.index("__device__ __forceinline__ void topk_merge(")
end = text.index("\n}\n", start) + 3
head, s, tail = text[:start], text[start:end], text[end:]


def rep(a, b):
    global s
    c = s.count(a)
    if c != 1:
        raise SystemExit(f"anchor found {c} times: {a!r}")
    s = s.replace(a, b)


rep("    block_exclusive_sum<BLOCK>(valid, total, s_warp);\n",
    "    block_exclusive_sum<BLOCK>(valid, total, s_warp);\n    if (tid == 0) DCP_TL(1);\n")
rep("            need = s_sel[1];\n            prefix |= (uint64_t)digit << shift;\n",
    "            need = s_sel[1];\n            if (tid == 0) DCP_ACC(8, 1);\n            prefix |= (uint64_t)digit << shift;\n")
rep("    uint32_t gt0 = 0, eq0 = 0;\n", "    if (tid == 0) DCP_TL(2);\n    uint32_t gt0 = 0, eq0 = 0;\n")
rep("    const uint32_t emitted = gt0 + min(eq0, need);\n",
    "    if (tid == 0) DCP_TL(3);\n    const uint32_t emitted = gt0 + min(eq0, need);\n")
open(path, "w").write(head + s + tail)
