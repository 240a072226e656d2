#!/bin/bash
# half-peak latency (redis), RSS flood (memory), bytes/key, redis-benchmark
OUT=${OUT:-/tmp/fgb/final}; mkdir -p $OUT; BIN=${BIN:-/tmp/fg}; HALF=${HALF:?set HALF to half the redis uniform peak}
# The load generator: flashgate-bench, $BENCH or built from this checkout.
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
bench_tool
RP=63796; GP=19295; HP=19296
redis-server --port $RP --save '' --appendonly no --daemonize yes --logfile $OUT/redis2.log >/dev/null; sleep 0.5
wait_port() { for i in $(seq 50); do (echo > /dev/tcp/127.0.0.1/$GP) 2>/dev/null && break; sleep 0.1; done; sleep 0.5; }
# 1. latency at half peak, redis backend, uniform
$BIN serve --backend redis --redis-addr 127.0.0.1:$RP --grpc-addr 127.0.0.1:$GP --http-addr 127.0.0.1:$HP --log-level warn > $OUT/srv2.log 2>&1 & SRV=$!; wait_port
$BENCH --addr 127.0.0.1:$GP --duration 10s --concurrency 32 --users 100000 --hot 0 --rate $HALF --quiet --json > $OUT/redis_halfpeak.json
# CPU of redis at half peak is not measured here
kill $SRV; wait $SRV 2>/dev/null
# 2. RSS with a 1,000,000-user flood on the memory backend
$BIN serve --backend memory --grpc-addr 127.0.0.1:$GP --http-addr 127.0.0.1:$HP --log-level warn > $OUT/srv3.log 2>&1 & SRV=$!; wait_port
grep -E "VmRSS" /proc/$SRV/status > $OUT/rss_before.txt
$BENCH --addr 127.0.0.1:$GP --duration 30s --concurrency 32 --users 1000000 --hot 0 --quiet --json > $OUT/memory_flood.json
grep -E "VmRSS|VmHWM" /proc/$SRV/status > $OUT/rss_after.txt
curl -s 127.0.0.1:$HP/metrics | grep -E "^go_memstats_heap_inuse_bytes|^flashgate_checks_total" > $OUT/flood_metrics.txt
kill $SRV; wait $SRV 2>/dev/null
# 3. Redis bytes per key: keys shaped like the script's (11-byte members, µs scores, PEXPIRE)
redis-cli -p $RP FLUSHALL >/dev/null
FILL='local n,l=tonumber(ARGV[1]),tonumber(ARGV[2]) for k=1,n do local key="fg:{"..string.format("%06x",k).."}:coupon_per_uid:user-"..k for i=1,l do redis.call("ZADD",key,string.format("%.0f",1733150000000000+i),"mmmmmmmm"..string.format("%03d",i)) end redis.call("PEXPIRE",key,3600000) end return n'
for spec in "100000 5" "200 1000"; do set -- $spec
  redis-cli -p $RP FLUSHALL >/dev/null; sleep 0.2; m0=$(redis-cli -p $RP INFO memory | awk -F: '/^used_memory:/{print $2+0}')
  redis-cli -p $RP EVAL "$FILL" 0 $1 $2 >/dev/null; m1=$(redis-cli -p $RP INFO memory | awk -F: '/^used_memory:/{print $2+0}')
  echo "limit=$2 keys=$1 used_memory_before=$m0 after=$m1 bytes_per_key=$(( (m1-m0)/$1 )) encoding=$(redis-cli -p $RP OBJECT ENCODING 'fg:{000001}:coupon_per_uid:user-1')" >> $OUT/bytes_per_key.txt
done
redis-cli -p $RP FLUSHALL >/dev/null
# 4. redis-benchmark EVALSHA of window/redisstore/redis.lua, 1 key, limit 5, window 1 s
SHA=$(redis-cli -p $RP SCRIPT LOAD "$(cat window/redisstore/redis.lua)")
redis-cli -p $RP CONFIG RESETSTAT >/dev/null
redis-benchmark -p $RP -n 200000 -c 64 -r 100000 -q EVALSHA $SHA 1 'fg:{__rand_int__}:u' m__rand_int__ '' 5 1000000 0 2>&1 | tr '\r' '\n' | tail -1 > $OUT/redis_benchmark.txt
redis-cli -p $RP INFO commandstats | grep evalsha >> $OUT/redis_benchmark.txt
echo "SHA=$SHA" >> $OUT/redis_benchmark.txt
redis-cli -p $RP shutdown nosave >/dev/null 2>&1
head -50 $OUT/*.txt $OUT/*.json
