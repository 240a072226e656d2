# Shared by scripts/bench-cost.sh and scripts/bench-ratelimit.sh (sourced, after OUT, RP, GP and HP are set):
# their redis-server and the server under test, started on free ports and stopped on any exit; and, for
# every bench script, the load generator.
SRV_PID=""

# bench_tool sets BENCH to the load generator and reference server, flashgate-bench: $BENCH if set, else
# built from this checkout into OUT. It is the same for every server binary a script compares.
bench_tool() {
  if [ -z "${BENCH:-}" ]; then
    BENCH="$OUT/flashgate-bench"
    (cd "$(dirname "${BASH_SOURCE[0]}")/.." && go build -o "$BENCH" ./cmd/flashgate-bench) || exit 1
  fi
}

# bench_ratelimit_bin sets RL to envoyproxy/ratelimit's service_cmd: $1 if given, else OUT/ratelimit, built
# there from the Go module proxy when absent (RL_VERSION, default latest: go mod download, then go build
# ./src/service_cmd in a copy).
bench_ratelimit_bin() {
  RL=${1:-}
  [ -n "$RL" ] && return 0
  RL="$OUT/ratelimit"
  [ -x "$RL" ] && return 0
  local src
  src=$(cd "$OUT" && GOFLAGS=-mod=mod go mod download -json "github.com/envoyproxy/ratelimit@${RL_VERSION:-latest}" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])') || exit 1
  rm -rf "$OUT/ratelimit-src" && cp -r "$src" "$OUT/ratelimit-src" && chmod -R u+w "$OUT/ratelimit-src"
  (cd "$OUT/ratelimit-src" && go build -o "$RL" ./src/service_cmd) || exit 1
}

# bench_ratelimit_config writes ratelimit's runtime config under OUT/runtime/ratelimit/config: domain
# flashsale, one descriptor uid, 5 per second (flashgate serves the same with --rls-config).
bench_ratelimit_config() {
  mkdir -p "$OUT/runtime/ratelimit/config"
  cat > "$OUT/runtime/ratelimit/config/flashsale.yaml" <<'YAML'
domain: flashsale
descriptors:
  - key: uid
    rate_limit:
      unit: second
      requests_per_unit: 5
YAML
}

bench_cleanup() {
  bench_server_down
  redis-cli -p "$RP" shutdown nosave >/dev/null 2>&1
}

# bench_start_redis refuses ports already in use (it would measure, flush and stop someone else's
# server), then starts the benchmark's redis-server on RP and stops it when the script exits.
bench_start_redis() {
  local p
  for p in "$GP" "$HP"; do
    if (echo > "/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "port $p is in use: set GP and HP" >&2; exit 1; fi
  done
  if redis-cli -p "$RP" ping >/dev/null 2>&1; then echo "a Redis already answers on port $RP: set RP" >&2; exit 1; fi
  trap bench_cleanup EXIT
  trap 'exit 130' INT TERM
  redis-server --port "$RP" --save '' --appendonly no --daemonize yes --logfile "$OUT/redis.log"
  for _ in $(seq 50); do redis-cli -p "$RP" ping >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "redis-server did not start on port $RP (see $OUT/redis.log)" >&2
  exit 1
}

# bench_server_up NAME waits for the server SRV_PID to listen on GP. If it died or never listened it says
# so, leaves an empty NAME.json (which bench-medians.py reports as a failed run) and returns 1.
bench_server_up() {
  for _ in $(seq 50); do (echo > "/dev/tcp/127.0.0.1/$GP") 2>/dev/null && break; sleep 0.1; done
  sleep 1
  if kill -0 "$SRV_PID" 2>/dev/null && (echo > "/dev/tcp/127.0.0.1/$GP") 2>/dev/null; then
    return 0
  fi
  echo "$1: the server did not start (see $OUT/srv.log)" >&2
  : > "$OUT/$1.json"
  bench_server_down
  return 1
}

# bench_server_down stops the server under test, if one runs.
bench_server_down() {
  if [ -n "$SRV_PID" ]; then
    kill "$SRV_PID" 2>/dev/null
    wait "$SRV_PID" 2>/dev/null
  fi
  SRV_PID=""
}
