#!/bin/bash
# Redis CPU per request of flashgate's script against the textbook one (BENCHMARKS.md, "Redis cost per check"),
# the recipe of the textbook's README: redis-benchmark, 50 clients, keys rl:<random of RANGE>, CPU from
# INFO cpu over the calls.
# usage: scripts/redis-cost.sh PORT TEXTBOOK.lua [ROUNDS]     (a redis-server must listen on PORT)
# Prints µs of Redis CPU per request: the textbook script by the recipe (redis-benchmark pipelined 16 deep)
# and by cmd/evalbench the same way, then flashgate's with 1, 4, 8 and 16 requests per script call (the
# auto-pipeline's batches), pipelined to 16 requests in flight; then both at 8 requests per round trip (the
# textbook -P 8, flashgate one call of 8 with -P 1), what an auto-pipelined batch of 8 is end to end.
# flashgate's script is driven by cmd/evalbench (built here): its hit spec is binary, which
# redis-benchmark cannot send.
# RANGE (default 100000) is the key space and N (default 200000) the requests per run: RANGE=100000000
# N=1000000 makes nearly every request create its key and, over a run of several seconds, most keys
# expire during it, as in the end-to-end load of 100,000 users on a 1 s window. C (default 50) is
# the connections: C=2 is the shape of flashgate's auto-pipeline end to end (one or two connections with
# a call in flight, so every round trip is a wake-up of Redis's event loop of its own).
set -eu
P=$1; TB=$2; ROUNDS=${3:-3}; RANGE=${RANGE:-100000}; N=${N:-200000}; C=${C:-50}
cd "$(dirname "$0")/.."
cpu() { redis-cli -p "$P" info cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user):/{s+=$2} END{printf "%.6f", s}'; }
per() { # requests redis-benchmark-args...: µs per request
  local n=$1; shift
  redis-cli -p "$P" flushall >/dev/null
  local b a; b=$(cpu); redis-benchmark -p "$P" -c "$C" -r "$RANGE" -q "$@" >/dev/null; a=$(cpu)
  awk -v a="$a" -v b="$b" -v n="$n" 'BEGIN{printf "%.2f", (a-b)/n*1e6}'
}
TBSHA=$(redis-cli -p "$P" script load "$(cat "$TB")")
EB=$(mktemp -d)/evalbench
trap 'rm -rf "$(dirname "$EB")"' EXIT
go build -o "$EB" ./cmd/evalbench
eb() { # evalbench-args...: µs per request
  redis-cli -p "$P" flushall >/dev/null
  "$EB" -addr "127.0.0.1:$P" -c "$C" -range "$RANGE" -n "$N" -cpu "$@" | awk '{print $NF}'
}
batch() { # B [DEPTH]: µs per request with B requests per call, DEPTH (16) requests in flight per connection
  local b=$1 d=${2:-16}
  eb -kind flashgate -per "$b" -P $((d / b))
}
for r in $(seq "$ROUNDS"); do
  echo "round $r: textbook $(per "$N" -n "$N" -P 16 evalsha "$TBSHA" 1 rl:__rand_int__ 0 1000 5 m:__rand_int__:__rand_int__)" \
    "textbook-evalbench $(eb -kind textbook -script "$TB" -P 16)" \
    "flashgate-1 $(batch 1) flashgate-4 $(batch 4) flashgate-8 $(batch 8) flashgate-16 $(batch 16)" \
    "textbook-P8 $(per "$N" -n "$N" -P 8 evalsha "$TBSHA" 1 rl:__rand_int__ 0 1000 5 m:__rand_int__:__rand_int__)" \
    "flashgate-8-P1 $(batch 8 8)"
done
