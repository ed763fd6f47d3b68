#!/usr/bin/env python3
"""A/B of two or more builds' `dcp-mla bench` in one device call, in alternating rounds.

    python3 scripts/ab-bench.py [--rounds 3] [--filter mla_decode] [--json OUT.json] \
        main=/path/to/dcp-mla-main lazy=/path/to/dcp-mla-lazy

Each round runs every binary once (`BIN bench --filter TEXT --json FILE`), in an order rotated
by one each round, so a drift of the card's clocks over the call (power, temperature) falls on
every build alike. Prints, per bench row, each build's microseconds of every round and, for every
build after the first, the ratio of its median to the first build's (< 1: faster). Compare
builds this way, in one process tree and one call, never by figures from different calls.
Exits non-zero if a run fails or a build is missing a row the first build has.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run_bench(binary, filt, path):
    # `--json FILE`, not `--json-out FILE`: builds from before the rename know only the old form,
    # which newer builds still accept (with a deprecation warning) until the release after next.
    cmd = [binary, "bench", "--json", path] + (["--filter", filt] if filt else [])
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if res.returncode != 0:
        sys.stderr.write(res.stdout[-4000:])
        raise SystemExit(f"{binary} bench exited {res.returncode}")
    with open(path) as f:
        data = json.load(f)
    rows = data.get("rows", []) if isinstance(data, dict) else data
    return {(r["family"], r["shape"]): r["us"] for r in rows if isinstance(r, dict) and r.get("us")}


def report(a, builds, times, rounds_done):
    """Prints the table of every round so far (and writes --json): called after each round, so a
    call cut short by its time limit still leaves the finished rounds' figures."""
    base = builds[0][0]
    status = 0
    w = max((len(f"{f} {s}") for f, s in times[base]), default=10)
    head = f"{'row':<{w}}" + "".join(f"  {n + ' us':>{8 * rounds_done}}" for n, _ in builds)
    head += "".join(f"  {n + '/' + base:>12}" for n, _ in builds[1:])
    print(head)
    out = []
    for row, base_us in times[base].items():
        line = f"{row[0] + ' ' + row[1]:<{w}}"
        rec = {"family": row[0], "shape": row[1], "us": {}, "ratio": {}}
        for n, _ in builds:
            us = times[n].get(row)
            if us is None:
                status = 1
                line += f"  {'(missing)':>{8 * rounds_done}}"
                continue
            rec["us"][n] = us
            line += "  " + " ".join(f"{x:7.1f}" for x in us).rjust(8 * rounds_done)
        for n, _ in builds[1:]:
            us = times[n].get(row)
            if us:
                ratio = statistics.median(us) / statistics.median(base_us)
                rec["ratio"][n] = ratio
                line += f"  {ratio:>12.3f}"
            else:
                line += f"  {'-':>12}"
        print(line)
        out.append(rec)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rounds": rounds_done, "filter": a.filter, "builds": [n for n, _ in builds], "rows": out}, f, indent=1)
    sys.stdout.flush()
    return status


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--filter", default="mla_decode")
    ap.add_argument("--json", help="write every round's figures and the ratios here")
    ap.add_argument("builds", nargs="+", help="NAME=BINARY, the first is the base")
    a = ap.parse_args()
    builds = []
    for b in a.builds:
        name, sep, path = b.partition("=")
        if not sep or not name or not os.access(path, os.X_OK):
            raise SystemExit(f"not NAME=EXECUTABLE: {b}")
        builds.append((name, path))
    if len({n for n, _ in builds}) != len(builds):
        raise SystemExit("build names must differ")
    times = {n: {} for n, _ in builds}  # name -> row -> [us per round]
    status = 0
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = builds[r % len(builds):] + builds[:r % len(builds)]
            for name, path in order:
                got = run_bench(path, a.filter, os.path.join(tmp, f"{name}-{r}.json"))
                for row, us in got.items():
                    times[name].setdefault(row, []).append(us)
                print(f"round {r + 1}: {name} done ({len(got)} rows)", file=sys.stderr)
            print(f"== after round {r + 1} of {a.rounds}")
            status = report(a, builds, times, r + 1)
    return status


if __name__ == "__main__":
    sys.exit(main())
