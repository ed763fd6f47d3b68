#!/usr/bin/env python3
"""Prints the SASS instructions where a kernel's warps stall most, from an ncu report.

On the GPU machine (ncu there, not here):
  ncu -o /tmp/r --section SourceCounters --section WarpStateStats --kernel-name regex:NAME \
      --launch-count 1 BINARY ARGS...
  ncu --import /tmp/r.ncu-rep --page source --csv --print-source sass > /tmp/src.csv
  python3 tools/diag/ncu-hotspots.py /tmp/src.csv [N]
Each line: share of all stall samples, the instruction, and its largest stall reasons.
"""
import csv
import sys


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f)]
    # the header is the first row naming a sampling column
    hi = next(i for i, r in enumerate(rows) if any("Sampling" in c for c in r))
    head, body = rows[hi], rows[hi + 1:]
    col = {name: i for i, name in enumerate(head)}
    samp = next(i for n, i in col.items() if n.startswith("Warp Stall Sampling (All"))
    src = next((i for n, i in col.items() if n in ("Source", "Sass", "SASS")), 1)
    addr = next((i for n, i in col.items() if n.startswith("Address")), 0)
    reasons = [i for n, i in col.items() if n.startswith("stall_") or "Stall Sampling (" in n and i != samp]

    def num(x):
        try:
            return float(x.replace(",", ""))
        except ValueError:
            return 0.0

    body = [r for r in body if len(r) == len(head)]
    total = sum(num(r[samp]) for r in body) or 1.0
    print(f"columns: {', '.join(head)}")
    print(f"total samples {total:.0f} over {len(body)} instructions")
    for r in sorted(body, key=lambda r: -num(r[samp]))[:top]:
        why = sorted(((num(r[i]), head[i]) for i in reasons if num(r[i]) > 0), reverse=True)[:3]
        why_s = ", ".join(f"{n}={v:.0f}" for v, n in why)
        print(f"{100 * num(r[samp]) / total:5.1f}%  {r[addr]:>8}  {r[src][:70]:<70}  {why_s}")


if __name__ == "__main__":
    main()
