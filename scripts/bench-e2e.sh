#!/bin/bash
# End-to-end runs of the do-nothing server, serve on memory and serve on Redis (uniform and attack), all in one
# sitting with the same bench flags.
# Build first: go build -o /tmp/fg ./cmd/flashgate        usage: scripts/bench-e2e.sh BIN OUTDIR
# The load generator and the no-op server are flashgate-bench: $BENCH, or built here from this checkout.
#
# Runs (10 s each, 32 workers, 2 connections, 100k users): the no-op server (the ceiling), serve
# --backend memory, serve --backend redis uniform (--hot 0) and attack (--hot 0.9, INFO commandstats
# around it), the same two with --redis-autopipeline=false (_noap), then paced runs at half of the Redis
# uniform peak: no-op, Redis with its default hz 10, Redis with hz 100, and _noap (LATENCY LATEST after
# each Redis run).
# For every run it records the CPU time of each process: bench (client_cpu_s), the server
# (/proc/PID/stat) and redis-server (INFO cpu), and prints them per check. Server and Redis CPU are read
# around the whole bench process (its connection warm-up included: a few health checks); bench's own
# covers its timed run only.
#
# PIN=1 gives redis-server core 1 to itself and runs the servers and bench on core 0 (taskset; Go then
# sizes GOMAXPROCS to 1): Redis on a core of its own, as in a deployment, with the no-op ceiling
# measured under the same constraint.
set -u
BIN=$1; OUT=$2; mkdir -p "$OUT"
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
bench_tool
if [ "${PIN:-0}" = 1 ]; then GO_CPU="taskset -c 0"; REDIS_CPU="taskset -c 1"; else GO_CPU=""; REDIS_CPU=""; fi
RP=63791; GP=19291; HP=19292
B="--duration 10s --concurrency 32 --users 100000 --quiet --json"
TCK=$(getconf CLK_TCK)
$REDIS_CPU redis-server --port $RP --save '' --appendonly no --daemonize yes --latency-monitor-threshold 1 \
  --logfile "$OUT/redis.log" >/dev/null
sleep 0.5
rcli() { redis-cli -p $RP "$@"; }
run_srv() { $GO_CPU "$@" > "$OUT/srv.log" 2>&1 & SRV=$!; for _ in $(seq 50); do (echo > /dev/tcp/127.0.0.1/$GP) 2>/dev/null && break; sleep 0.1; done; sleep 0.5; }
stop_srv() { kill $SRV; wait $SRV 2>/dev/null; }
srv_cpu() { awk -v t="$TCK" '{printf "%.2f", ($14+$15)/t}' /proc/$SRV/stat; }
redis_cpu() { rcli INFO cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user):/{s+=$2} END{printf "%.3f", s}'; }
# bench NAME [bench flags...]: one run, its JSON in NAME.json and the server's and Redis's CPU in NAME.cpu
bench() {
  local name=$1; shift
  local s0 r0; s0=$(srv_cpu); r0=$(redis_cpu)
  $GO_CPU "$BENCH" --addr 127.0.0.1:$GP $B "$@" > "$OUT/$name.json"
  echo "server_cpu_s=$(awk -v a="$s0" -v b="$(srv_cpu)" 'BEGIN{print b-a}') redis_cpu_s=$(awk -v a="$r0" -v b="$(redis_cpu)" 'BEGIN{print b-a}')" > "$OUT/$name.cpu"
}
serve_redis() { run_srv "$BIN" serve --backend redis --redis-addr 127.0.0.1:$RP --grpc-addr 127.0.0.1:$GP --http-addr 127.0.0.1:$HP --log-level warn "$@"; }

run_srv "$BENCH" noop-server --addr 127.0.0.1:$GP
bench noop --hot 0; stop_srv
run_srv "$BIN" serve --backend memory --grpc-addr 127.0.0.1:$GP --http-addr 127.0.0.1:$HP --log-level warn
bench memory --hot 0; stop_srv
for ap in true false; do
  sfx=$([ $ap = true ] || echo _noap)
  serve_redis --redis-autopipeline=$ap
  bench redis_uniform$sfx --hot 0
  rcli CONFIG RESETSTAT >/dev/null
  bench redis_attack$sfx --hot 0.9
  rcli INFO commandstats > "$OUT/redis_attack${sfx}_cmdstats.txt"
  stop_srv
done

HALF=$(grep -o '"throughput":[0-9.]*' "$OUT/redis_uniform.json" | awk -F: '{printf "%d", $2/2}')
echo "$HALF" > "$OUT/half_rate.txt"
run_srv "$BENCH" noop-server --addr 127.0.0.1:$GP
bench noop_half --hot 0 --rate "$HALF"; stop_srv
for hz in 10 100; do
  rcli CONFIG SET hz $hz >/dev/null; rcli LATENCY RESET >/dev/null
  serve_redis
  bench redis_half_hz$hz --hot 0 --rate "$HALF"
  rcli LATENCY LATEST | paste -sd' ' > "$OUT/redis_half_hz${hz}_latency.txt"
  stop_srv
done
rcli CONFIG SET hz 10 >/dev/null; rcli LATENCY RESET >/dev/null
serve_redis --redis-autopipeline=false
bench redis_half_noap --hot 0 --rate "$HALF"
rcli LATENCY LATEST | paste -sd' ' > "$OUT/redis_half_noap_latency.txt"
stop_srv
rcli shutdown nosave >/dev/null 2>&1

python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
runs = ["noop", "memory", "redis_uniform", "redis_attack", "redis_uniform_noap", "redis_attack_noap",
        "noop_half", "redis_half_hz10", "redis_half_hz100", "redis_half_noap"]
ceil = json.load(open(os.path.join(out, "noop.json")))["throughput"]
print(f"{'run':18} {'checks/s':>9} {'%noop':>6} {'p50':>6} {'p99':>6} {'p99.9':>6} {'max':>6}  CPU µs/check: {'bench':>5} {'server':>6} {'redis':>5} {'total':>5}")
for r in runs:
    j = json.load(open(os.path.join(out, r + ".json")))
    c = dict(kv.split("=") for kv in open(os.path.join(out, r + ".cpu")).read().split())
    n, l = j["requests"], j["latency_ms"]
    us = lambda s: float(s) * 1e6 / n
    b, s, rd = us(j.get("client_cpu_s", 0)), us(c["server_cpu_s"]), us(c["redis_cpu_s"])
    pct = 100 * j["throughput"] / ceil
    print(f"{r:18} {j['throughput']:9.0f} {pct:5.0f}% {l['p50']:6.2f} {l['p99']:6.2f} {l['p99_9']:6.2f} {l['max']:6.2f}  {'':13} {b:5.0f} {s:6.0f} {rd:5.0f} {b+s+rd:5.0f}")
PY
for f in "$OUT"/redis_half_*_latency.txt; do echo "$(basename "$f"): $(cat "$f")"; done
