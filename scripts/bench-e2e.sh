#!/bin/bash
# Run from the repo root after: go build -o /tmp/fg ./cmd/flashgate   (see BENCHMARKS.md)
# usage: round.sh BIN OUTDIR  — noop, memory, redis uniform, redis attack; 10s each, c=32, 100k users
BIN=$1; OUT=$2; mkdir -p $OUT
RP=63791; GP=19291; HP=19292
B="--duration 10s --concurrency 32 --users 100000 --quiet --json"
redis-server --port $RP --save '' --appendonly no --daemonize yes --logfile $OUT/redis.log >/dev/null
sleep 0.5
run_srv() { "$@" > $OUT/srv.log 2>&1 & SRV=$!; for i in $(seq 50); do (echo > /dev/tcp/127.0.0.1/$GP) 2>/dev/null && break; sleep 0.1; done; sleep 0.5; }
stop_srv() { kill $SRV; wait $SRV 2>/dev/null; }
run_srv $BIN noop-server --addr 127.0.0.1:$GP
$BIN bench --addr 127.0.0.1:$GP $B --hot 0 > $OUT/noop.json; stop_srv
run_srv $BIN serve --backend memory --grpc-addr 127.0.0.1:$GP --http-addr 127.0.0.1:$HP --log-level warn
$BIN bench --addr 127.0.0.1:$GP $B --hot 0 > $OUT/memory.json; stop_srv
run_srv $BIN serve --backend redis --redis-addr 127.0.0.1:$RP --grpc-addr 127.0.0.1:$GP --http-addr 127.0.0.1:$HP --log-level warn
$BIN bench --addr 127.0.0.1:$GP $B --hot 0 > $OUT/redis_uniform.json
redis-cli -p $RP CONFIG RESETSTAT >/dev/null
$BIN bench --addr 127.0.0.1:$GP $B --hot 0.9 > $OUT/redis_attack.json
redis-cli -p $RP INFO commandstats > $OUT/redis_attack_cmdstats.txt
stop_srv
redis-cli -p $RP shutdown nosave >/dev/null 2>&1
for f in noop memory redis_uniform redis_attack; do echo "$f: $(cat $OUT/$f.json)"; done
