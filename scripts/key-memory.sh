#!/bin/bash
# Redis memory per limit key, an exact log of every entry in use (BENCHMARKS.md, "Memory per key").
# usage: scripts/key-memory.sh PORT      (a redis-server must listen on PORT; it is flushed)
# Writes keys shaped as serve makes them ("fg:{6 hex}:coupon_per_uid:user-I"), each a sorted set of its
# limit's entries (11-byte members, µs scores, PEXPIRE), 100,000 keys at limit 5 and 200 at limit 1000, and
# prints used_memory's growth per key and the set's encoding.
set -eu
RP=$1
FILL='local n,l=tonumber(ARGV[1]),tonumber(ARGV[2]) for k=1,n do local key="fg:{"..string.format("%06x",k).."}:coupon_per_uid:user-"..k for i=1,l do redis.call("ZADD",key,string.format("%.0f",1733150000000000+i),"mmmmmmmm"..string.format("%03d",i)) end redis.call("PEXPIRE",key,3600000) end return n'
for spec in "100000 5" "200 1000"; do set -- $spec
  redis-cli -p "$RP" FLUSHALL >/dev/null; sleep 0.2; m0=$(redis-cli -p "$RP" INFO memory | awk -F: '/^used_memory:/{print $2+0}')
  redis-cli -p "$RP" EVAL "$FILL" 0 "$1" "$2" >/dev/null; m1=$(redis-cli -p "$RP" INFO memory | awk -F: '/^used_memory:/{print $2+0}')
  echo "limit=$2 keys=$1 used_memory_before=$m0 after=$m1 bytes_per_key=$(( (m1-m0)/$1 )) encoding=$(redis-cli -p "$RP" OBJECT ENCODING 'fg:{000001}:coupon_per_uid:user-1')"
done
redis-cli -p "$RP" FLUSHALL >/dev/null
