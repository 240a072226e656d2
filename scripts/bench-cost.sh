#!/bin/bash
# CPU cost per check, server and Redis (BENCHMARKS.md: CPU per check, Redis cost, latency at a fixed rate).
# usage: scripts/bench-cost.sh OUTDIR ROUNDS BIN...      (build first: go build -o /tmp/fg ./cmd/flashgate)
#
# For each round and each flashgate binary (alternating, so that a busy machine hits every binary alike) it
# runs the scenarios of $SCEN (default: all below), 8 s each, $WORKERS workers (default 32), 100,000 users,
# against a fresh serve (or flashgate-bench noop-server) on its own redis-server, with flashgate-bench as the
# load generator ($BENCH, or built from this checkout), and writes its JSON to OUTDIR/BIN-SCENARIO-rROUND.json:
# server_cpu_us_per_check (/proc/PID/stat), redis_cpu_us_per_check (INFO cpu) and
# redis_script_calls_per_check (INFO commandstats), with throughput and p50/p99.
#   noop          flashgate-bench noop-server (the do-nothing ext_authz server), minimal requests
#   noop-env      the same, Envoy-shaped requests (--shape envoy)
#   one-uni       serve, one rule (x-uid, 5/1s), uniform over the users
#   one-uni-env   the same, Envoy-shaped requests
#   one-hot       one rule, 90% of the requests from one user (--hot 0.9)
#   ex-uni        the built-in example (3 rules: uid, device, IP), uniform
#   ex-uni-env    the same, Envoy-shaped requests
#   ex-hot        the example, 90% from one user
#   ex-hot-env    the same, Envoy-shaped requests
#   noop-paced    flashgate-bench noop-server at a fixed 3000 checks/s
#   one-paced     one rule at a fixed 3000 checks/s
set -u
OUT=$1; ROUNDS=$2; shift 2; mkdir -p "$OUT"
RP=${RP:-63811}; GP=${GP:-19391}; HP=${HP:-19392}; WORKERS=${WORKERS:-32}
ONE="$(cd "$(dirname "$0")" && pwd)/one-rule.yaml"
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
bench_tool
bench_start_redis
run() { # name bin config(|noop) bench-args...
  local name=$1 bin=$2 mode=$3; shift 3
  if [ "$mode" = noop ]; then
    "$BENCH" noop-server --addr 127.0.0.1:$GP > "$OUT/srv.log" 2>&1 &
  else
    # shellcheck disable=SC2086
    "$bin" serve --backend redis --redis-addr 127.0.0.1:$RP --grpc-addr 127.0.0.1:$GP --http-addr 127.0.0.1:$HP \
      --log-level warn $mode > "$OUT/srv.log" 2>&1 &
  fi
  SRV_PID=$!
  bench_server_up "$name" || return
  redis-cli -p $RP flushall >/dev/null
  local redis=""; [ "$mode" != noop ] && redis="--redis-addr 127.0.0.1:$RP"
  # shellcheck disable=SC2086
  "$BENCH" --addr 127.0.0.1:$GP --duration 8s --concurrency "$WORKERS" --users 100000 --quiet --json \
    --server-pid "$SRV_PID" $redis "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  bench_server_down
}
for r in $(seq "$ROUNDS"); do
  for bin in "$@"; do
    b=$(basename "$bin")
    for sc in ${SCEN:-noop noop-env one-uni one-uni-env one-hot ex-uni ex-uni-env ex-hot ex-hot-env noop-paced one-paced}; do
      case $sc in
        noop) run "$b-noop-r$r" "$bin" noop --hot 0 ;;
        noop-env) run "$b-noop-env-r$r" "$bin" noop --hot 0 --shape envoy ;;
        one-uni) run "$b-one-uni-r$r" "$bin" "--config $ONE" --hot 0 ;;
        one-uni-env) run "$b-one-uni-env-r$r" "$bin" "--config $ONE" --hot 0 --shape envoy ;;
        one-hot) run "$b-one-hot-r$r" "$bin" "--config $ONE" --hot 0.9 ;;
        ex-uni) run "$b-ex-uni-r$r" "$bin" "" --hot 0 ;;
        ex-uni-env) run "$b-ex-uni-env-r$r" "$bin" "" --hot 0 --shape envoy ;;
        ex-hot) run "$b-ex-hot-r$r" "$bin" "" --hot 0.9 ;;
        ex-hot-env) run "$b-ex-hot-env-r$r" "$bin" "" --hot 0.9 --shape envoy ;;
        noop-paced) run "$b-noop-paced-r$r" "$bin" noop --hot 0 --rate 3000 ;;
        one-paced) run "$b-one-paced-r$r" "$bin" "--config $ONE" --hot 0 --rate 3000 ;;
        *) echo "unknown scenario $sc" >&2 ;;
      esac
    done
  done
done
bench_cleanup
"$(dirname "$0")/bench-medians.py" "$OUT"
