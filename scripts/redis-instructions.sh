#!/bin/bash
# Redis's instructions per request of flashgate's script against the textbook one (BENCHMARKS.md,
# "Redis cost per check"), counted by valgrind's callgrind: unlike CPU time, the count does not move with the machine's load,
# so a change to window/redisstore/redis.lua can be compared on a shared box in one run.
# usage: scripts/redis-instructions.sh [PORT]         (needs valgrind: Debian's valgrind package)
# Starts its own redis-server under callgrind on PORT (default 63950), and for each case runs
# cmd/evalbench (built here; one connection, one call in flight, fresh keys rl:<i>, as
# `redis-benchmark -c 1 -P 1` did before flashgate's spec became binary) and prints the instructions (Ir)
# Redis executed per request:
#   empty        EVALSHA of "return 1" with flashgate's arguments (the floor: networking and EVALSHA itself)
#   ratelimit    envoyproxy/ratelimit's check: INCRBY and EXPIRE of a fresh fixed-window counter, the two
#                pipelined per request (one round trip), then 16 requests in flight (ratelimit-P16)
#   floor-time   EVALSHA of a script that reads Redis TIME and replies as flashgate does (now, count, reset)
#   floor-fresh  the same, then ZCARD, ZADD NX and PEXPIRE of the key: the least a script deciding a fresh
#                key exactly, with time from Redis, runs (flashgate's one-key path on a fresh key, no more)
#   textbook     ../shared/reference/sliding_window.lua, one call per request, then 16 calls in flight
#   flashgate-B  window/redisstore/redis.lua with B requests per call (B = 1, 8, 16)
#   *-warm       one call per request on 1,000 keys, a limit of 1,000,000 per 1,000 s: each key holds entries
#                and has room (the trim, then the admission)
#   *-hot        one call per request on 100 keys, 5 per 1,000 s: all but the first 500 requests meet a full
#                key and are refused
#   textbook-P16-warm/-hot, flashgate-16-warm/-hot   the same keys at the goal's depth: 16 calls in flight
#                against 16 requests per call
#   flashgate-k3, -k3-warm, -k3-hot   requests of three keys each (the several-keys path, limits 5, 6, 7 or
#                1,000,000 and up), one call per request: Ir per request, so about three textbook calls' worth
#   flashgate-left, flashgate-16-left   one and 16 requests per call on 100 keys in turn, 5 per 1,000 s, the
#                script's clock passed in (evalbench -step): 2.2 s apart, so that all but the first 500
#                requests meet a full key whose oldest entry has just left the window (one trimmed, admitted)
# CASES (names, space-separated) runs only those cases.
# Each case starts from an empty Redis with no script loaded but its own (SCRIPT FLUSH): Lua's garbage
# collector walks every loaded script, so one case's script would cost the next.
# Instructions are not time: cache misses, system calls and wake-ups are not in them (scripts/redis-cost.sh
# and scripts/bench-cost.sh measure CPU time). The second figure counts only EVALSHA's own instructions
# (callgrind_annotate --inclusive): without the event loop and Redis's cron, whose share per request grows
# with the wall time a request takes under valgrind, so that it moves little with the box's load.
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
EB="$D/evalbench"
go build -o "$EB" ./cmd/evalbench
ir() { # NAME REQUESTS evalbench-flags...: Ir per request
  local name=$1 n=$2; shift 2
  [ -n "${CASES:-}" ] && [[ " $CASES " != *" $name "* ]] && return 0
  redis-cli -p "$P" flushall >/dev/null
  redis-cli -p "$P" script flush >/dev/null
  callgrind_control --zero "$VG" >/dev/null 2>&1
  "$EB" -addr "127.0.0.1:$P" -n "$n" "$@" >/dev/null
  callgrind_control --dump="$name" "$VG" >/dev/null 2>&1
  local f; f=$(ls -t "$D"/cg.out* | head -1)
  local ev; ev=$(callgrind_annotate --inclusive=yes "$f" 2>/dev/null | awk '/:evalShaCommand /{gsub(",", "", $1); print $1; exit}')
  awk -v n="$n" -v name="$name" -v ev="${ev:-0}" \
    '/^(summary|totals):/{printf "%-16s %8.0f Ir per request %8.0f in EVALSHA\n", name, $2/n, ev/n; exit}' "$f"
}
ir empty 3000 -kind empty
cat > "$D/floor-time.lua" <<'LUA'
local t = redis.call('TIME')
local now = t[1] .. string.sub('00000', #t[2]) .. t[2]
return { now, 1, 0 }
LUA
cat > "$D/floor-fresh.lua" <<'LUA'
local t = redis.call('TIME')
local now = t[1] .. string.sub('00000', #t[2]) .. t[2]
local card = redis.call('ZCARD', KEYS[1])
card = card + redis.call('ZADD', KEYS[1], 'NX', now, ARGV[1])
redis.call('PEXPIRE', KEYS[1], string.sub(ARGV[4], 22))
return { now, card, 0 }
LUA
ir floor-time 3000 -kind flashgate -script "$D/floor-time.lua"
ir floor-fresh 3000 -kind flashgate -script "$D/floor-fresh.lua"
ir ratelimit 3000 -kind ratelimit
ir ratelimit-P16 8000 -kind ratelimit -P 16
ir textbook 3000 -kind textbook -script "$TEXTBOOK"
ir textbook-P16 8000 -kind textbook -script "$TEXTBOOK" -P 16
for b in 1 8 16; do
  ir "flashgate-$b" 6000 -kind flashgate -per "$b"
done
WARM="-range 1000 -limit 1000000 -window 1000000"
HOT="-range 100 -window 1000000"
for k in textbook flashgate; do
  s=$([ "$k" = textbook ] && echo "$TEXTBOOK" || echo window/redisstore/redis.lua)
  # shellcheck disable=SC2086 # WARM and HOT are lists of flags
  ir "$k-warm" 6000 -kind "$k" -script "$s" $WARM
  # shellcheck disable=SC2086
  ir "$k-hot" 6000 -kind "$k" -script "$s" $HOT
done
# shellcheck disable=SC2086
{
  ir textbook-P16-warm 8000 -kind textbook -script "$TEXTBOOK" -P 16 $WARM
  ir flashgate-16-warm 8000 -kind flashgate -per 16 $WARM
  ir textbook-P16-hot 8000 -kind textbook -script "$TEXTBOOK" -P 16 $HOT
  ir flashgate-16-hot 8000 -kind flashgate -per 16 $HOT
  ir flashgate-k3 3000 -kind flashgate -keys 3
  ir flashgate-k3-warm 3000 -kind flashgate -keys 3 $WARM
  ir flashgate-k3-hot 3000 -kind flashgate -keys 3 $HOT
}
LEFT="-range 100 -window 1000000 -step 2200000"
# shellcheck disable=SC2086
{
  ir flashgate-left 6000 -kind flashgate $LEFT
  ir flashgate-16-left 8000 -kind flashgate -per 16 $LEFT
}
