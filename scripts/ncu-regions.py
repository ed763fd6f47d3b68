#!/usr/bin/env python3
"""Per-region sums of an ncu source CSV (SASS): regions split at SETMAXREG instructions."""
import csv, sys
rows = list(csv.reader(open(sys.argv[1], newline="")))
hi = next(i for i, r in enumerate(rows) if any("Sampling" in c for c in r))
head, body = rows[hi], [r for r in rows[hi + 1:] if len(r) == len(rows[hi])]
col = {n: i for i, n in enumerate(head)}
samp = next(i for n, i in col.items() if n.startswith("Warp Stall Sampling (All"))
ex = col.get("Instructions Executed")
src = next((i for n, i in col.items() if n in ("Source", "Sass", "SASS")), 1)
def num(x):
    try: return float(x.replace(",", ""))
    except ValueError: return 0.0
regions = [[]]
for r in body:
    if "MAXREG" in r[src]:
        regions.append([])
    regions[-1].append(r)
tot = sum(num(r[samp]) for r in body) or 1
for k, reg in enumerate(regions):
    s = sum(num(r[samp]) for r in reg); e = sum(num(r[ex]) for r in reg) if ex is not None else 0
    hg = sum(num(r[ex]) for r in reg if "HGMMA" in r[src])
    print(f"region {k}: {len(reg)} instrs, samples {100*s/tot:.1f}%, warp-instructions executed {e:.0f}, HGMMA executed {hg:.0f}")
    top = sorted(reg, key=lambda r: -num(r[samp]))[:12]
    for r in top:
        print(f"   {100*num(r[samp])/tot:5.2f}%  ex={num(r[ex]):.0f}  {r[src][:70]}")
