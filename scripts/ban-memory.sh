#!/bin/bash
# Redis memory per fleet-wide ban in force (BENCHMARKS.md, "Fleet-wide bans").
# usage: scripts/ban-memory.sh PORT [N]      (a redis-server must listen on PORT; it is flushed)
# Writes N bans (default 100000) as FleetBans.Add does, on keys shaped as serve makes them
# ("fg:{6 hex}:coupon_per_uid:user-I"): SET <K>!ban <ms> PXAT <ms> and ZADD fg:bans <ms> <K>, one hour
# ahead, then prints used_memory per ban, MEMORY USAGE of one <K>!ban and of the index per member, and of
# one denial counter <K>!bc (which exists only while a key's denials are being counted).
set -eu
P=$1; N=${2:-100000}
used() { redis-cli -p "$P" info memory | tr -d '\r' | awk -F: '/^used_memory:/{print $2}'; }
redis-cli -p "$P" flushall >/dev/null
redis-cli -p "$P" zadd fg:bans +inf '~epoch' >/dev/null # the index's epoch member
before=$(used)
until=$(( ($(date +%s) + 3600) * 1000 ))
awk -v n="$N" -v u="$until" 'BEGIN {
  for (i = 0; i < n; i++) {
    k = sprintf("fg:{%06x}:coupon_per_uid:user-%d", (i * 2654435761) % 16777216, i)
    printf "SET %s!ban %d PXAT %d\r\nZADD fg:bans %d %s\r\n", k, u, u, u, k
  }
}' | redis-cli -p "$P" --pipe >/dev/null
after=$(used)
k0=$(printf 'fg:{%06x}:coupon_per_uid:user-0' 0)
redis-cli -p "$P" set "$k0!bc" 3 px 10000 >/dev/null
ban=$(redis-cli -p "$P" memory usage "$k0!ban")
bc=$(redis-cli -p "$P" memory usage "$k0!bc")
idx=$(redis-cli -p "$P" memory usage fg:bans samples 0)
awk -v b="$before" -v a="$after" -v n="$N" -v ban="$ban" -v idx="$idx" -v bc="$bc" 'BEGIN {
  printf "bans: %d\nused_memory per ban: %.1f bytes\nMEMORY USAGE <K>!ban: %d bytes\n", n, (a - b) / n, ban
  printf "MEMORY USAGE index per member: %.1f bytes\nMEMORY USAGE <K>!bc (while counting): %d bytes\n", idx / n, bc
}'
