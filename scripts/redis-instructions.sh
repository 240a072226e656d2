#!/bin/bash
# Redis's instructions per request of flashgate's script against the textbook one (issue 11; BENCHMARKS.md
# §12), counted by valgrind's callgrind: unlike CPU time, the count does not move with the machine's load,
# so a change to window/redis.lua can be compared on a shared box in one run.
# usage: scripts/redis-instructions.sh [PORT]         (needs valgrind: Debian's valgrind package)
# Starts its own redis-server under callgrind on PORT (default 63950), and for each case runs redis-benchmark
# (one connection, fresh keys: -r 100000000) and prints the instructions (Ir) Redis executed per request:
#   empty        EVALSHA of "return 1" with flashgate's arguments (the floor: networking and EVALSHA itself)
#   textbook     ../shared/reference/sliding_window.lua, one call per request, then -P 16 (the recipe's depth)
#   flashgate-B  window/redis.lua with B requests per call (B = 1, 8, 16)
# Instructions are not time: cache misses, system calls and wake-ups are not in them (scripts/redis-cost.sh
# and scripts/bench-cost.sh measure CPU time).
set -eu
REPO=$(cd "$(dirname "$0")/.." && pwd)
P=${1:-63950}
TEXTBOOK=${TEXTBOOK:-$REPO/../shared/reference/sliding_window.lua}
command -v valgrind >/dev/null || { echo "valgrind not found: apt-get install valgrind" >&2; exit 1; }
[ -r "$TEXTBOOK" ] || { echo "no textbook script at $TEXTBOOK (set TEXTBOOK)" >&2; exit 1; }
TEXTBOOK=$(cd "$(dirname "$TEXTBOOK")" && pwd)/$(basename "$TEXTBOOK")
cd "$REPO"
if redis-cli -p "$P" ping >/dev/null 2>&1; then echo "a Redis already answers on port $P" >&2; exit 1; fi
D=$(mktemp -d)
valgrind --tool=callgrind --callgrind-out-file="$D/cg.out" redis-server --port "$P" --save '' --appendonly no \
  > "$D/valgrind.log" 2>&1 &
VG=$!
trap 'redis-cli -p "$P" shutdown nosave >/dev/null 2>&1; wait "$VG" 2>/dev/null; rm -rf "$D"' EXIT
up=""
for _ in $(seq 100); do redis-cli -p "$P" ping >/dev/null 2>&1 && { up=1; break; }; sleep 0.2; done
[ -n "$up" ] || { echo "redis-server under valgrind did not start on port $P:" >&2; cat "$D/valgrind.log" >&2; exit 1; }
ir() { # NAME REQUESTS-PER-CALL CALLS PIPELINE redis-benchmark-command...: Ir per request
  local name=$1 per=$2 n=$3 pipe=$4; shift 4
  redis-cli -p "$P" flushall >/dev/null
  callgrind_control --zero "$VG" >/dev/null 2>&1
  redis-benchmark -p "$P" -c 1 -r 100000000 -n "$n" -P "$pipe" -q "$@" >/dev/null 2>&1
  callgrind_control --dump="$name" "$VG" >/dev/null 2>&1
  local f; f=$(ls -t "$D"/cg.out* | head -1)
  awk -v n="$n" -v per="$per" -v name="$name" '/^(summary|totals):/{printf "%-14s %8.0f Ir per request\n", name, $2/n/per; exit}' "$f"
}
EMPTY=$(redis-cli -p "$P" script load "return 1")
TB=$(redis-cli -p "$P" script load "$(cat "$TEXTBOOK")")
FG=$(redis-cli -p "$P" script load "$(cat window/redis.lua)")
ir empty 1 3000 1 evalsha "$EMPTY" 1 rl:__rand_int__ m:__rand_int__ "" 1 "5 1000000 1 0 0 1000"
ir textbook 1 3000 1 evalsha "$TB" 1 rl:__rand_int__ 0 1000 5 m:__rand_int__:__rand_int__
ir textbook-P16 1 8000 16 evalsha "$TB" 1 rl:__rand_int__ 0 1000 5 m:__rand_int__:__rand_int__
for b in 1 8 16; do
  keys=(); args=()
  for i in $(seq "$b"); do keys+=("rl:__rand_int__"); args+=("m:__rand_int__:$i" "" 1 "5 1000000 1 0 0 1000"); done
  ir "flashgate-$b" "$b" $((3000 / b * 2)) 1 evalsha "$FG" "$b" "${keys[@]}" "${args[@]}"
done
