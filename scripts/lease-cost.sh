#!/bin/bash
# Script calls and Redis CPU per admitted check on one global rule, leased and not (BENCHMARKS.md: leased
# admissions). usage: scripts/lease-cost.sh OUTDIR [LEASE...]      LEASE: none, or a length such as 50ms
#
# For each LEASE it starts a fresh redis-server and $SIDECARS (default 4) `flashgate serve` on it, with one
# rule on /api/claim of $LIMIT (default 2000) per 1s (with `lease: {for: LEASE}` unless none), and runs one
# flashgate-bench per sidecar for $DURATION (default 5s), $CONC workers each (default 6), paced to $RATE
# checks/s per sidecar if set (default: as fast as possible). Redis decides every check: each serve gets
# $SERVE_ARGS (default: --failure-mode deny --redis-timeout 200ms --check-deadline 400ms), so that a loaded
# machine's late replies are refused, not admitted by the local fallback. It prints, per LEASE: admitted checks per second,
# EVALSHA calls per admitted check (the heartbeats' once a second per sidecar subtracted) and Redis CPU µs
# per admitted check (INFO cpu), and writes the benches' JSON to OUTDIR.
set -u
OUT=$1; shift; mkdir -p "$OUT"
LEASES=("$@"); [ ${#LEASES[@]} -eq 0 ] && LEASES=(none 50ms)
SERVE_ARGS=${SERVE_ARGS:---failure-mode deny --redis-timeout 200ms --check-deadline 400ms}
SIDECARS=${SIDECARS:-4}; LIMIT=${LIMIT:-2000}; DURATION=${DURATION:-5s}; CONC=${CONC:-6}; RATE=${RATE:-0}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
(cd "$ROOT" && go build -o "$OUT/flashgate" ./cmd/flashgate && go build -o "$OUT/flashgate-bench" ./cmd/flashgate-bench) || exit 1
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
info() { redis-cli -p "$RP" info "$1" | tr -d '\r'; }
for LEASE in "${LEASES[@]}"; do
  RP=$(free_port)
  redis-server --port "$RP" --save '' --appendonly no --logfile "$OUT/redis-$LEASE.log" & PIDS+=($!)
  for _ in $(seq 50); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.1; done
  CFG="$OUT/claim-$LEASE.yaml"
  { echo "domain: bench"; echo "sources: {path: {request_path: {}}}"; echo "descriptors:"
    echo "  - {key: path, value: /api/claim, name: claims, rate_limit: {requests: $LIMIT, window: 1s}$([ "$LEASE" != none ] && echo ", lease: {for: $LEASE}")}"; } > "$CFG"
  GRPC=(); HTTP=()
  for i in $(seq "$SIDECARS"); do
    G=$(free_port); H=$(free_port); GRPC+=("$G"); HTTP+=("$H")
    "$OUT/flashgate" serve --backend redis --redis-addr "127.0.0.1:$RP" --grpc-addr "127.0.0.1:$G" --http-addr "127.0.0.1:$H" \
      --config "$CFG" --key-prefix b --ban-duration 0 --log-level warn $SERVE_ARGS 2>>"$OUT/serve-$LEASE.log" & PIDS+=($!)
  done
  for H in "${HTTP[@]}"; do
    for _ in $(seq 100); do [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$H/readyz")" = 200 ] && break; sleep 0.1; done
  done
  redis-cli -p "$RP" config resetstat >/dev/null
  CPU0=$(info cpu | awk -F: '/^used_cpu_(sys|user):/ {s+=$2} END {printf "%.6f", s}')
  BENCHES=()
  for i in "${!GRPC[@]}"; do
    "$OUT/flashgate-bench" --addr "127.0.0.1:${GRPC[$i]}" --duration "$DURATION" --concurrency "$CONC" --path /api/claim \
      --users 1000 --rate "$RATE" --json > "$OUT/bench-$LEASE-$i.json" 2>>"$OUT/bench-$LEASE.log" & BENCHES+=($!)
  done
  wait "${BENCHES[@]}"
  CPU1=$(info cpu | awk -F: '/^used_cpu_(sys|user):/ {s+=$2} END {printf "%.6f", s}')
  CALLS=$(info commandstats | awk -F'[=,:]' '/^cmdstat_(evalsha|eval):/ {s+=$3} END {print s+0}')
  ALLOWED=0; LEASED=0; TAKEN=0
  for H in "${HTTP[@]}"; do
    M=$(curl -s "http://127.0.0.1:$H/metrics")
    ALLOWED=$((ALLOWED + $(awk '/^flashgate_checks_total\{.*decision="allowed"/ {s+=$2} END {printf "%d", s}' <<<"$M")))
    LEASED=$((LEASED + $(awk '/^flashgate_lease_admissions_total / {printf "%d", $2}' <<<"$M")))
    TAKEN=$((TAKEN + $(awk '/^flashgate_leases_total / {printf "%d", $2}' <<<"$M")))
  done
  echo "lease $LEASE: $ALLOWED admitted, $LEASED of them from $TAKEN leases" 
  SECS=${DURATION%s}
  python3 - "$LEASE" "$ALLOWED" "$CALLS" "$CPU0" "$CPU1" "$SECS" "$SIDECARS" <<'PY'
import sys
lease, allowed, calls, c0, c1, secs, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7])
calls = max(calls - n * secs, 0)  # the fleet heartbeat: one script call a second per sidecar
a = max(allowed, 1)
print(f"lease {lease}: {allowed / secs:.0f} admitted/s, {calls / a:.3f} script calls per admitted check, "
      f"{(c1 - c0) * 1e6 / a:.1f} Redis CPU µs per admitted check")
PY
  cleanup; PIDS=()
done
