#!/bin/bash
# CPU cost per check of the HTTP front-end (serve --http-authz-addr) against a do-nothing Go HTTP server
# (BENCHMARKS.md, "The HTTP front-end against a do-nothing HTTP server").
# usage: scripts/bench-http.sh OUTDIR ROUNDS BIN...      (build first: go build -o /tmp/fg ./cmd/flashgate)
#
# For each round and each flashgate binary (alternating, so that a busy machine hits every run alike) it runs
# the scenarios of $SCEN (default: all below), 8 s each, $WORKERS workers (default 32, each with its own
# keep-alive connection over HTTP), 100,000 uniform users, against a fresh server (serve, or flashgate-bench
# noop-http-server / noop-server) with flashgate-bench ($BENCH, or built from this checkout) as the load
# generator, and writes its JSON to OUTDIR/BIN-SCENARIO-rROUND.json: server_cpu_us_per_check (/proc/PID/stat)
# and, on Redis, redis_cpu_us_per_check (INFO cpu), with throughput and p50/p99. Every serve has its own
# redis-server's data flushed; the one-rule file is scripts/one-rule.yaml (5 per second per x-uid).
#   noop-http          flashgate-bench noop-http-server (answers 200, HTTP server settings of serve's front-end)
#   noop-http-fields   the same answering with the five rate-limit fields of serve's admission (--ratelimit-fields)
#   mem-http           serve --backend memory, one rule, asked over HTTP
#   redis-http         serve --backend redis, one rule, asked over HTTP
#   noop-http-paced    noop-http at a fixed 2000 checks/s (latency)
#   mem-http-paced     mem-http at a fixed 2000 checks/s
#   redis-http-paced   redis-http at a fixed 2000 checks/s
#   noop-grpc          flashgate-bench noop-server (the do-nothing gRPC ext_authz server), for reference
#   redis-grpc         serve --backend redis, one rule, asked over gRPC ext_authz, for reference
set -u
OUT=$1; ROUNDS=$2; shift 2; mkdir -p "$OUT"
RP=${RP:-63821}; GP=${GP:-19491}; HP=${HP:-19492}; XP=${XP:-19493}; WORKERS=${WORKERS:-32}
ONE="$(cd "$(dirname "$0")" && pwd)/one-rule.yaml"
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
if (echo > "/dev/tcp/127.0.0.1/$XP") 2>/dev/null; then echo "port $XP is in use: set XP" >&2; exit 1; fi
bench_tool
bench_start_redis
# run NAME BIN SERVER API BENCH-ARGS...: SERVER is noop-http, noop-http-fields, noop-grpc, memory or redis; the load goes to GP
# (serve's --http-authz-addr for API http, its --grpc-addr for API authz).
run() {
  local name=$1 bin=$2 server=$3 api=$4; shift 4
  local redis=""
  case $server in
    noop-http) "$BENCH" noop-http-server --addr 127.0.0.1:$GP > "$OUT/srv.log" 2>&1 & ;;
    noop-http-fields) "$BENCH" noop-http-server --ratelimit-fields --addr 127.0.0.1:$GP > "$OUT/srv.log" 2>&1 & ;;
    noop-grpc) "$BENCH" noop-server --addr 127.0.0.1:$GP > "$OUT/srv.log" 2>&1 & ;;
    *)
      local backend=(--backend memory)
      if [ "$server" = redis ]; then
        backend=(--backend redis --redis-addr 127.0.0.1:$RP)
        redis="--redis-addr 127.0.0.1:$RP"
      fi
      local listen=(--grpc-addr 127.0.0.1:$GP)
      [ "$api" = http ] && listen=(--grpc-addr 127.0.0.1:$XP --http-authz-addr 127.0.0.1:$GP)
      "$bin" serve "${backend[@]}" "${listen[@]}" --http-addr 127.0.0.1:$HP --config "$ONE" \
        --log-level warn > "$OUT/srv.log" 2>&1 & ;;
  esac
  SRV_PID=$!
  bench_server_up "$name" || return
  redis-cli -p $RP flushall >/dev/null
  # shellcheck disable=SC2086
  "$BENCH" --api "$api" --addr 127.0.0.1:$GP --duration 8s --concurrency "$WORKERS" --users 100000 --hot 0 \
    --quiet --json --server-pid "$SRV_PID" $redis "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  bench_server_down
}
for r in $(seq "$ROUNDS"); do
  for bin in "$@"; do
    b=$(basename "$bin")
    for sc in ${SCEN:-noop-http mem-http redis-http noop-http-paced mem-http-paced redis-http-paced noop-grpc redis-grpc}; do
      case $sc in
        noop-http) run "$b-noop-http-r$r" "$bin" noop-http http ;;
        noop-http-fields) run "$b-noop-http-fields-r$r" "$bin" noop-http-fields http ;;
        mem-http) run "$b-mem-http-r$r" "$bin" memory http ;;
        redis-http) run "$b-redis-http-r$r" "$bin" redis http ;;
        noop-http-paced) run "$b-noop-http-paced-r$r" "$bin" noop-http http --rate 2000 ;;
        mem-http-paced) run "$b-mem-http-paced-r$r" "$bin" memory http --rate 2000 ;;
        redis-http-paced) run "$b-redis-http-paced-r$r" "$bin" redis http --rate 2000 ;;
        noop-grpc) run "$b-noop-grpc-r$r" "$bin" noop-grpc authz ;;
        redis-grpc) run "$b-redis-grpc-r$r" "$bin" redis authz ;;
        *) echo "unknown scenario $sc" >&2 ;;
      esac
    done
  done
done
bench_cleanup
"$(dirname "$0")/bench-medians.py" "$OUT"
