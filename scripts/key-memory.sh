#!/bin/bash
# Redis memory per limit key, an exact log of every entry in use, against envoyproxy/ratelimit's counter
# (BENCHMARKS.md, "Memory per key").
# usage: scripts/key-memory.sh PORT      (a redis-server must listen on PORT; it is flushed)
# Writes keys shaped as serve makes them ("fg:{6 hex}:coupon_per_uid:user-I"), each a sorted set of its
# entries (11-byte members, µs scores, PEXPIRE): 100,000 keys of 1 and of 5 entries (a 5 per second rule: a
# uniform user, a full window), 20,000 of 60 (a user at one request a second under a 1-minute window),
# 200 of 1,000 (a full 1,000 per hour window); then ratelimit's key for each, one counter per user and
# fixed window ("flashsale_uid_u0000001_1733150000", INCRBY, EXPIRE), whatever the window and the count.
# Prints used_memory's growth per key and the encoding.
set -eu
RP=$1
FILL='local n,l=tonumber(ARGV[1]),tonumber(ARGV[2]) for k=1,n do local key="fg:{"..string.format("%06x",k).."}:coupon_per_uid:user-"..k for i=1,l do redis.call("ZADD",key,string.format("%.0f",1733150000000000+i),"mmmmmmmm"..string.format("%03d",i)) end redis.call("PEXPIRE",key,3600000) end return n'
RLFILL='local n=tonumber(ARGV[1]) for k=1,n do local key="flashsale_uid_u"..string.format("%07d",k).."_1733150000" redis.call("INCRBY",key,5) redis.call("EXPIRE",key,3600) end return n'
used() { redis-cli -p "$RP" INFO memory | awk -F: '/^used_memory:/{print $2+0}'; }
for spec in "100000 1" "100000 5" "20000 60" "200 1000"; do set -- $spec
  redis-cli -p "$RP" FLUSHALL >/dev/null; sleep 0.2; m0=$(used)
  redis-cli -p "$RP" EVAL "$FILL" 0 "$1" "$2" >/dev/null; m1=$(used)
  echo "flashgate entries=$2 keys=$1 used_memory_before=$m0 after=$m1 bytes_per_key=$(( (m1-m0)/$1 )) encoding=$(redis-cli -p "$RP" OBJECT ENCODING 'fg:{000001}:coupon_per_uid:user-1')"
done
redis-cli -p "$RP" FLUSHALL >/dev/null; sleep 0.2; m0=$(used)
redis-cli -p "$RP" EVAL "$RLFILL" 0 100000 >/dev/null; m1=$(used)
echo "ratelimit counter keys=100000 used_memory_before=$m0 after=$m1 bytes_per_key=$(( (m1-m0)/100000 )) encoding=$(redis-cli -p "$RP" OBJECT ENCODING flashsale_uid_u0000001_1733150000)"
redis-cli -p "$RP" FLUSHALL >/dev/null
