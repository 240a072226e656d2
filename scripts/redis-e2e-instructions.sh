#!/bin/bash
# Redis's instructions per check end to end (BENCHMARKS.md, "Redis cost per check"): `flashgate serve` on a redis-server run under
# valgrind's callgrind, driven by flashgate-bench at a fixed rate. Unlike CPU time (scripts/bench-cost.sh), the
# count does not move with the box's load, so two binaries' scripts can be compared end to end on a shared box.
# usage: scripts/redis-e2e-instructions.sh OUTDIR ROUNDS BIN...   (needs valgrind; build each BIN first)
# For each round, each binary (alternating) and each scenario of $SCEN (default: all below): a fresh redis-server
# under callgrind on RP (default 63881), `BIN serve --backend redis` on GP and HP (19481, 19482) with one script
# call per check (--redis-autopipeline=false: batches under valgrind would follow its slowness, not the binary),
# a Redis budget of seconds (valgrind runs Redis ~50× slower), --fleet-size 1 (no heartbeat script); then the load
# generator ($BENCH, or flashgate-bench built from this checkout) for 20 s at 500 checks/s, 32 workers. It prints
# per run the checks, the denials, Redis's instructions (Ir) per check in all and in EVALSHA alone (without the
# event loop and cron, whose share follows wall time), and script calls and commands per check.
#   one-fresh   one rule (x-uid, 5/1s), 100,000 users: nearly every check starts its key
#   one-warm    one rule, 200 users (2.5 checks/s each): keys with entries, some full
#   ex-fresh    the built-in example (3 rules: uid, device, IP), 100,000 users
#   ex-warm     the example, 200 users
#   one-hot     one rule, 90% of the checks from one user (the Guard answers most of them)
set -eu
[ $# -ge 3 ] || { echo "usage: $0 OUTDIR ROUNDS BIN..." >&2; exit 2; }
command -v valgrind >/dev/null || { echo "valgrind not found: apt-get install valgrind" >&2; exit 1; }
OUT=$1; ROUNDS=$2; shift 2; mkdir -p "$OUT"
RP=${RP:-63881}; GP=${GP:-19481}; HP=${HP:-19482}
ONE="$(cd "$(dirname "$0")" && pwd)/one-rule.yaml"
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
bench_tool
for p in "$GP" "$HP" "$RP"; do
  if (echo > "/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "port $p is in use: set RP, GP and HP" >&2; exit 1; fi
done
VG=""; SRV=""
stop() {
  if [ -n "$SRV" ]; then kill "$SRV" 2>/dev/null; wait "$SRV" 2>/dev/null || true; fi
  if [ -n "$VG" ]; then redis-cli -p "$RP" shutdown nosave >/dev/null 2>&1; wait "$VG" 2>/dev/null || true; fi
  SRV=""; VG=""
}
trap stop EXIT
trap 'exit 130' INT TERM
run() { # NAME BIN CONFIG(- for the built-in example) bench-args...
  local name=$1 bin=$2 cfg=$3 d=$OUT/$1; shift 3
  rm -rf "$d"; mkdir -p "$d"
  valgrind --tool=callgrind --callgrind-out-file="$d/cg.out" redis-server --port "$RP" --save '' --appendonly no \
    > "$d/valgrind.log" 2>&1 &
  VG=$!
  for _ in $(seq 100); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.2; done
  local c=(); [ "$cfg" != - ] && c=(--config "$cfg")
  "$bin" serve --backend redis --redis-addr "127.0.0.1:$RP" --grpc-addr "127.0.0.1:$GP" --http-addr "127.0.0.1:$HP" \
    --log-level warn --redis-timeout 2s --check-deadline 5s --fleet-size 1 --redis-autopipeline=false "${c[@]}" \
    > "$d/srv.log" 2>&1 &
  SRV=$!
  for _ in $(seq 100); do (echo > "/dev/tcp/127.0.0.1/$GP") 2>/dev/null && break; sleep 0.2; done
  sleep 1
  callgrind_control --zero "$VG" >/dev/null 2>&1
  "$BENCH" --addr "127.0.0.1:$GP" --duration 20s --concurrency 32 --rate 500 --quiet --json \
    --redis-addr "127.0.0.1:$RP" "$@" > "$d/bench.json" 2> "$d/bench.err"
  callgrind_control --dump="$name" "$VG" >/dev/null 2>&1
  stop
  local f all ev
  f=$(ls -t "$d"/cg.out.* | head -1)
  all=$(callgrind_annotate "$f" 2>/dev/null | awk '/PROGRAM TOTALS/{gsub(",", "", $1); print $1; exit}')
  ev=$(callgrind_annotate --inclusive=yes "$f" 2>/dev/null | awk '/:evalShaCommand /{gsub(",", "", $1); print $1; exit}')
  python3 - "$d/bench.json" "$name" "${all:-0}" "${ev:-0}" <<'EOF'
import json, sys
d, name, all_ir, ev = json.load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
n = d["requests"]
print(f'{name:28s} checks {n} errors {d["errors"]} denied {d["denied"]} Ir/check {all_ir / n:8.0f}'
      f' in EVALSHA {ev / n:8.0f} calls/check {d["redis_script_calls_per_check"]:.3f}'
      f' cmds/check {d["redis_commands_per_check"]:.2f}', flush=True)
EOF
}
for r in $(seq "$ROUNDS"); do
  for bin in "$@"; do
    b=$(basename "$bin")
    for sc in ${SCEN:-one-fresh one-warm ex-fresh ex-warm one-hot}; do
      case $sc in
        one-fresh) run "$b-$sc-r$r" "$bin" "$ONE" --users 100000 --hot 0 ;;
        one-warm) run "$b-$sc-r$r" "$bin" "$ONE" --users 200 --hot 0 ;;
        ex-fresh) run "$b-$sc-r$r" "$bin" - --users 100000 --hot 0 ;;
        ex-warm) run "$b-$sc-r$r" "$bin" - --users 200 --hot 0 ;;
        one-hot) run "$b-$sc-r$r" "$bin" "$ONE" --users 100000 --hot 0.9 ;;
        *) echo "unknown scenario $sc" >&2 ;;
      esac
    done
  done
done
