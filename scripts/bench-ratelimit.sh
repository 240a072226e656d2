#!/bin/bash
# CPU cost per check of flashgate against envoyproxy/ratelimit, same load, same Redis
# (BENCHMARKS.md, "CPU per check, against envoyproxy/ratelimit").
# usage: scripts/bench-ratelimit.sh OUTDIR ROUNDS FLASHGATE_BIN [RATELIMIT_BIN]
#   FLASHGATE_BIN: go build -o /tmp/fg ./cmd/flashgate
#   the load generator: flashgate-bench, $BENCH or built here from this checkout
#   RATELIMIT_BIN: envoyproxy/ratelimit's service_cmd; built here from the Go module proxy when not given
#                  (RL_VERSION, default latest: go mod download, then go build ./src/service_cmd in a copy)
#
# One rule in both: 5 requests per second per uid, ratelimit's config format (flashgate serves it with
# --rls-config). Each scenario runs 8 s, 32 workers, 100,000 users, against a fresh server; all share the
# script's own redis-server on RP (flushed before each); per round the scenarios alternate, so that a busy
# machine hits each alike. bench's JSON goes to OUTDIR/SCENARIO-rROUND.json; the medians are printed at the
# end, and the exit status is 1 if a run has no result. Ports: RP (Redis), GP (gRPC), HP and HP+1 (HTTP);
# the script refuses ports already in use.
#   rl            ratelimit, defaults (a Redis pipeline of INCRBY + EXPIRE per request, fixed window),
#                 USE_STATSD=false (its stats stay in memory), ShouldRateLimit, uniform over the users
#   rl-pipe       the same with REDIS_PIPELINE_WINDOW=150us (its README's advice for throughput)
#   rl-hot        ratelimit, 90% of the requests from one user (--hot 0.9)
#   rl-hot-cache  the same with LOCAL_CACHE_SIZE_IN_BYTES=100MB (its local cache of over-limit keys)
#   fg-rls        flashgate serve --rls-config, the same requests (exact sliding windows)
#   fg-rls-hot    the same, 90% from one user
#   rl-ex         ratelimit, three descriptors per request (uid 5/s, device 10/s, ip 100/s: the limits of
#                 flashgate's built-in example), each per user
#   fg-rls-ex     flashgate serve --rls-config, the same three-descriptor requests
#   fg-authz-ex   ext_authz Check on flashgate's built-in example (the same three limits, one script call)
#   fg-authz      flashgate's own API: ext_authz Check, one rule x-uid 5/1s, minimal requests
#   fg-authz-env  the same, Envoy-shaped requests (--shape envoy)
#   noop          flashgate-bench noop-server: a do-nothing ext_authz server, minimal requests
set -u
OUT=$1; ROUNDS=$2; FG=$3; RL=${4:-}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
RP=${RP:-63831}; GP=${GP:-19591}; HP=${HP:-19592}
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
bench_ratelimit_bin "$RL"
bench_ratelimit_config
cat > "$OUT/runtime/ratelimit/config/flashsale3.yaml" <<'YAML'
domain: flashsale3
descriptors:
  - key: uid
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: device
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 100}
YAML
ONE="$(cd "$(dirname "$0")" && pwd)/one-rule.yaml"
bench_tool
bench_start_redis
run() { # name kind(rl|fg|noop) server-args-or-env... -- bench-args...
  local name=$1 kind=$2; shift 2
  local sargs=()
  while [ "$1" != -- ]; do sargs+=("$1"); shift; done; shift
  redis-cli -p "$RP" flushall >/dev/null
  case $kind in
    rl) env "${sargs[@]}" USE_STATSD=false LOG_LEVEL=error REDIS_SOCKET_TYPE=tcp REDIS_URL=127.0.0.1:$RP \
          RUNTIME_ROOT="$OUT/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
          GRPC_HOST=127.0.0.1 GRPC_PORT=$GP HOST=127.0.0.1 PORT=$HP DEBUG_HOST=127.0.0.1 DEBUG_PORT=$((HP + 1)) \
          "$RL" > "$OUT/srv.log" 2>&1 & ;;
    fg) "$FG" serve --backend redis --redis-addr 127.0.0.1:$RP --grpc-addr 127.0.0.1:$GP --http-addr 127.0.0.1:$HP \
          --log-level warn "${sargs[@]}" > "$OUT/srv.log" 2>&1 & ;;
    noop) "$BENCH" noop-server --addr 127.0.0.1:$GP > "$OUT/srv.log" 2>&1 & ;;
  esac
  SRV_PID=$!
  bench_server_up "$name" || return
  local redis=(--redis-addr 127.0.0.1:$RP); [ "$kind" = noop ] && redis=()
  "$BENCH" --addr 127.0.0.1:$GP --duration 8s --concurrency 32 --users 100000 --quiet --json \
    --server-pid "$SRV_PID" "${redis[@]}" "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  bench_server_down
}
for r in $(seq "$ROUNDS"); do
  for sc in ${SCEN:-rl rl-pipe rl-hot rl-hot-cache rl-ex fg-rls fg-rls-hot fg-rls-ex fg-authz fg-authz-env fg-authz-ex noop}; do
    case $sc in
      rl) run "rl-r$r" rl X=0 -- --api rls ;;
      rl-pipe) run "rl-pipe-r$r" rl REDIS_PIPELINE_WINDOW=150us -- --api rls ;;
      rl-hot) run "rl-hot-r$r" rl X=0 -- --api rls --hot 0.9 ;;
      rl-hot-cache) run "rl-hot-cache-r$r" rl LOCAL_CACHE_SIZE_IN_BYTES=100000000 -- --api rls --hot 0.9 ;;
      fg-rls) run "fg-rls-r$r" fg --rls-config "$OUT/runtime/ratelimit" --config "$ONE" -- --api rls ;;
      fg-rls-hot) run "fg-rls-hot-r$r" fg --rls-config "$OUT/runtime/ratelimit" --config "$ONE" -- --api rls --hot 0.9 ;;
      rl-ex) run "rl-ex-r$r" rl X=0 -- --api rls --domain flashsale3 --descriptor-key uid,device,ip ;;
      fg-rls-ex) run "fg-rls-ex-r$r" fg --rls-config "$OUT/runtime/ratelimit" --config "$ONE" -- --api rls --domain flashsale3 --descriptor-key uid,device,ip ;;
      fg-authz-ex) run "fg-authz-ex-r$r" fg -- ;;
      fg-authz) run "fg-authz-r$r" fg --config "$ONE" -- ;;
      fg-authz-env) run "fg-authz-env-r$r" fg --config "$ONE" -- --shape envoy ;;
      noop) run "noop-r$r" noop -- ;;
      *) echo "unknown scenario $sc" >&2 ;;
    esac
  done
done
bench_cleanup
"$(dirname "$0")/bench-medians.py" "$OUT"
