#!/bin/bash
# The midnight step (BENCHMARKS.md, "The midnight step"): a sidecar idle for $IDLE, then 50-fold load at once.
# usage: scripts/bench-step.sh OUTDIR ROUNDS BIN...      (build first: go build -o /tmp/fg ./cmd/flashgate)
#
# For each round and each flashgate binary (alternating, so that a busy machine hits every binary alike) it
# starts a fresh `serve --backend redis` with the one rule of scripts/one-rule.yaml on its own redis-server,
# held to one core (GOMAXPROCS=1, taskset -c $SRV_CPU), waits for it to turn ready, and runs
# `flashgate-bench step` ($BENCH, or built from this checkout; taskset -c $BENCH_CPU, with redis-server):
# $RATE checks/s for $IDLE, then $FACTOR × $RATE checks/s for $PEAK, 100,000 uniform users. It writes
# OUTDIR/BIN-rROUND.txt (the table: rows of 100 ms after the step) and .json, with `uptime` before the run.
# REDIS_IDLE_CUT=S sets Redis's `timeout` (it closes a connection idle for S seconds), as a proxy or a cloud
# load balancer between the sidecar and Redis cuts idle connections (0, the default: never).
#   IDLE=60s RATE=60 FACTOR=50 PEAK=10s SRV_CPU=1 BENCH_CPU=0 WORKERS=512 SERVE_ARGS= REDIS_IDLE_CUT=0   (defaults;
#   STEADY_FROM=D: where the steady state begins after the step, default 5s: set it below a shorter PEAK)
set -u
OUT=$1; ROUNDS=$2; shift 2; mkdir -p "$OUT"
RP=${RP:-63871}; GP=${GP:-19791}; HP=${HP:-19792}
IDLE=${IDLE:-60s}; RATE=${RATE:-60}; FACTOR=${FACTOR:-50}; PEAK=${PEAK:-10s}
SRV_CPU=${SRV_CPU:-1}; BENCH_CPU=${BENCH_CPU:-0}; WORKERS=${WORKERS:-512}; SERVE_ARGS=${SERVE_ARGS:-}
REDIS_IDLE_CUT=${REDIS_IDLE_CUT:-0}
ONE="$(cd "$(dirname "$0")" && pwd)/one-rule.yaml"
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
bench_tool
bench_start_redis
redis-cli -p "$RP" config set timeout "$REDIS_IDLE_CUT" >/dev/null
taskset -pc "$BENCH_CPU" "$(redis-cli -p "$RP" info server | sed -n 's/^process_id:\([0-9]*\).*/\1/p')" >/dev/null
for r in $(seq "$ROUNDS"); do
  for bin in "$@"; do
    name="$(basename "$bin")-r$r"
    redis-cli -p "$RP" flushall >/dev/null
    redis-cli -p "$RP" config resetstat >/dev/null
    # shellcheck disable=SC2086
    GOMAXPROCS=1 taskset -c "$SRV_CPU" "$bin" serve --backend redis --redis-addr 127.0.0.1:$RP \
      --grpc-addr 127.0.0.1:$GP --http-addr 127.0.0.1:$HP --config "$ONE" --log-level warn $SERVE_ARGS \
      > "$OUT/$name.srv.log" 2>&1 &
    SRV_PID=$!
    bench_server_up "$name" || continue
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$HP/readyz" >/dev/null && break; sleep 0.1; done
    { echo "# $(date -u +%FT%TZ) $name: uptime:$(uptime | sed 's/.*load average/ load average/')"
      echo "# redis timeout $REDIS_IDLE_CUT, serve $SERVE_ARGS"
      echo "# $BENCH step --idle $IDLE --idle-rate $RATE --factor $FACTOR --peak $PEAK --concurrency $WORKERS --users 100000"
    } > "$OUT/$name.txt"
    taskset -c "$BENCH_CPU" "$BENCH" step --addr 127.0.0.1:$GP --idle "$IDLE" --idle-rate "$RATE" --factor "$FACTOR" \
      --peak "$PEAK" ${STEADY_FROM:+--steady-from $STEADY_FROM} --concurrency "$WORKERS" --users 100000 --redis-addr 127.0.0.1:$RP --server-pid "$SRV_PID" --metrics-url http://127.0.0.1:$HP/metrics \
      --json-file "$OUT/$name.json" >> "$OUT/$name.txt" 2> "$OUT/$name.err"
    bench_server_down
    grep -A2 "^first second" "$OUT/$name.txt"
  done
done
bench_cleanup
