#!/usr/bin/env python3
"""Splits an ncu source-page CSV of a warp-specialised decode kernel by role (a measurement aid,
not part of the library; NOTES.md at 628d1db, twenty-first session).

Make the CSV on the GPU machine, e.g. for trio at H = 128:
  ncu --kernel-name regex:sm90_trio --launch-skip 5 --launch-count 1 \
      --section SourceCounters --section WarpStateStats --print-source sass --page source --csv \
      dcp-mla bench --filter "mla_decode b=128 q=1 H=128" > trio_src.csv
then here: tools/diag/ncu-roles.py trio_src.csv [--top N]

Each role's code follows its setmaxnreg (USETMAXREG) and runs to the EXITs of its piece loops;
a region is the SASS between two EXITs. For every region with samples it prints the total, the
warp-instructions and HGMMA it executed, the stall reasons, and the instructions with the most
samples. (It replaces ncu-regions.py, which split at SETMAXREG only.) For a scorer region it also splits a
tile into: the wait for the tile (before the first HGMMA), issuing S (first to last HGMMA), the
wait for S (WARPGROUP.DEPBAR) and the softmax up to the last mbarrier arrival.
"""
import collections
import csv
import sys


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    return rows[head], [r for r in rows[head + 1:] if len(r) == len(rows[head])]


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    path = sys.argv[1]
    top_n = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 8
    h, rows = load(path)
    col = {k: i for i, k in enumerate(h)}
    stalls = [k for k in h if k.startswith("stall_") and "Not Issued" not in k]
    samples = lambda r: int(num(r[col["Warp Stall Sampling (All Samples)"]]))
    executed = lambda r: num(r[col["Instructions Executed"]]) if "Instructions Executed" in col else 0.0
    total = sum(samples(r) for r in rows)
    print(f"{len(rows)} SASS lines, {total} samples")
    # regions: split after every EXIT (predicated or not)
    bounds, start = [], 0
    for i, r in enumerate(rows):
        if r[1].strip().endswith("EXIT"):
            bounds.append((start, i + 1))
            start = i + 1
    bounds.append((start, len(rows)))
    for a, b in bounds:
        seg = rows[a:b]
        tot = sum(samples(r) for r in seg)
        if tot < total * 0.01:
            continue
        regs = [r[1].strip() for r in rows[:b] if "SETMAXREG" in r[1]]  # the last one before: the role's
        st = collections.Counter()
        for r in seg:
            for k in stalls:
                st[k[6:]] += int(num(r[col[k]]))
        ex = sum(executed(r) for r in seg)
        hg_ex = sum(executed(r) for r in seg if "HGMMA" in r[1])
        print(f"\nlines {a}-{b}: {tot} samples ({100 * tot / total:.1f}%), warp-instructions executed {ex:.0f}, "
              f"HGMMA {hg_ex:.0f}" + (f", after {regs[-1]}" if regs else ""))
        print("  stalls: " + ", ".join(f"{k} {v}" for k, v in st.most_common(6)))
        for s, i, r in sorted(((samples(r), i, r) for i, r in enumerate(seg, a)), reverse=True)[:top_n]:
            print(f"  {i:6d} {s:6d} {100 * s / tot:5.1f}%  {r[1].strip()[:70]}")
        hg = [i for i in range(a, b) if "HGMMA.64x64x16" in rows[i][1]]
        dep = [i for i in range(a, b) if "WARPGROUP.DEPBAR" in rows[i][1]]
        arr = [i for i in range(a, b) if "SYNCS.ARRIVE" in rows[i][1]]
        if len(hg) >= 36 and dep and arr:  # a scorer: S is 36 m64n64k16 a tile
            d = next((x for x in dep if x > hg[0]), dep[0])
            part = lambda x, y: sum(samples(r) for r in rows[x:y])
            print(
                "  scorer tile: wait for the tile {:.0f}%, issue S {:.0f}%, wait for S {:.0f}%, softmax to hand-over {:.0f}%".format(
                    100 * part(a, hg[0]) / tot, 100 * part(hg[0], d) / tot, 100 * part(d, d + 1) / tot,
                    100 * part(d + 1, arr[-1] + 1) / tot))


if __name__ == "__main__":
    main()
