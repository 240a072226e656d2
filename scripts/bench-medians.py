#!/usr/bin/env python3
"""Medians of flashgate bench --json results: scripts/bench-medians.py OUTDIR [BASE]

Reads OUTDIR/NAME-rROUND.json (as scripts/bench-cost.sh and scripts/bench-ratelimit.sh write them) and prints,
per NAME, the median over its rounds of: checks/s, the share denied, server and Redis CPU µs per check and
their sum, Redis script calls and commands per check, p50 and p99 latency (ms).

With BASE (a NAME's prefix up to its scenario, e.g. standalone for standalone-one-uni), also each other
prefix's total CPU per check over BASE's on the same scenario, round by round: their median and range
(the runs of one round ran within minutes of each other, so a ratio within a round is less exposed to the
machine's load)."""
import collections
import glob
import json
import os
import re
import statistics
import sys

runs = collections.defaultdict(list)
rounds = collections.defaultdict(dict)  # NAME -> ROUND -> result
failed = []
for f in sorted(glob.glob(sys.argv[1] + '/*.json')):
    m = re.fullmatch(r'(.+)-r(\d+)\.json', os.path.basename(f))
    if not m:
        continue
    try:
        j = json.load(open(f))
    except ValueError:
        failed.append(f)  # the run wrote no JSON; its .err says why
        continue
    runs[m.group(1)].append(j)
    rounds[m.group(1)][m.group(2)] = j


def total(j):
    return j.get('server_cpu_us_per_check', 0) + j.get('redis_cpu_us_per_check', 0)


def med(js, f):
    v = [f(j) for j in js if f(j) is not None]
    return statistics.median(v) if v else float('nan')


print(f"{'run':30s} {'n':>2s} {'checks/s':>9s} {'denied':>7s} {'server µs':>10s} {'Redis µs':>9s} {'total µs':>9s} "
      f"{'calls':>6s} {'cmds':>6s} {'p50 ms':>7s} {'p99 ms':>7s}")
for k, js in sorted(runs.items()):
    print(f"{k:30s} {len(js):2d} {med(js, lambda j: j['throughput']):9.0f} "
          f"{med(js, lambda j: j['denied'] / max(j['requests'], 1)):7.3f} "
          f"{med(js, lambda j: j.get('server_cpu_us_per_check')):10.1f} {med(js, lambda j: j.get('redis_cpu_us_per_check')):9.1f} "
          f"{med(js, total):9.1f} "
          f"{med(js, lambda j: j.get('redis_script_calls_per_check')):6.3f} {med(js, lambda j: j.get('redis_commands_per_check')):6.2f} "
          f"{med(js, lambda j: j['latency_ms']['p50']):7.2f} {med(js, lambda j: j['latency_ms']['p99']):7.2f}")
if len(sys.argv) > 2:
    base = sys.argv[2] + '-'
    print(f"\ntotal CPU per check over {sys.argv[2]}'s, per round: median (min-max) rounds")
    for bk in sorted(k for k in rounds if k.startswith(base)):
        scen = bk[len(base) - 1:]
        for k in sorted(k for k in rounds if k.endswith(scen) and k != bk):
            rs = [total(j) / total(rounds[bk][r]) for r, j in rounds[k].items() if r in rounds[bk]]
            if rs:
                print(f"{k:30s} {statistics.median(rs):5.2f} ({min(rs):.2f}-{max(rs):.2f}) {len(rs)}")
if failed:
    print('runs without a result (see their .err):', ' '.join(failed), file=sys.stderr)
    sys.exit(1)
