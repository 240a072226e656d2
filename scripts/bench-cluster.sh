#!/bin/bash
# CPU cost per check on Redis Cluster against standalone (BENCHMARKS.md, "Redis Cluster at standalone's cost").
# usage: scripts/bench-cluster.sh OUTDIR ROUNDS BIN        (build first: go build -o /tmp/fg ./cmd/flashgate)
#
# Starts one standalone redis-server on RP and two Clusters of masters without replicas (3 on CP.., 6 on
# CP+10..; each node's bus port is its port + 10000: the default CP keeps both below the ephemeral ports), all
# kept for the whole run. For each round and each topology of $TOPO (default: all below, alternated round by
# round so that a busy machine hits each alike) it runs the scenarios of $SCEN (default: one-uni ex-uni), 8 s
# each, $WORKERS workers (default 64), 100,000 uniform users, against a fresh serve of BIN, after a FLUSHALL,
# and writes flashgate-bench's JSON to OUTDIR/TOPO-SCENARIO-rROUND.json: server_cpu_us_per_check
# (/proc/PID/stat), redis_cpu_us_per_check (INFO cpu summed over the topology's masters),
# redis_script_calls_per_check and redis_commands_per_check.
#   standalone     one redis-server, auto-pipelined (serve's default)
#   c3             3-master Cluster, auto-pipelined per master (serve's default)
#   c6             6-master Cluster, the same
#   c3-perkey      3-master Cluster, --redis-autopipeline=false: one script call per key
#   TOPO@N         any of the above with N workers instead of $WORKERS (c6@128: twice the checks in flight
#                  on twice the masters, each master seeing what one of c3's sees at 64)
#   TOPO~R         paced to R checks a second in all (flashgate-bench --rate) instead of as fast as the box
#                  goes: c3~4000 and c6~8000 give each master the same load, c6~4000 the same total load
#                  (TOPO@N~R combines both)
#   TOPO+wW        serve with --redis-batch-window W (c3~3500+w1ms); after the others (TOPO@N~R+wW)
#   one-uni        one rule (x-uid, 5/1s, scripts/one-rule.yaml)
#   ex-uni         the built-in example (3 rules: uid, device, IP)
set -u
OUT=$1; ROUNDS=$2; BIN=$3; mkdir -p "$OUT"
RP=${RP:-63821}; CP=${CP:-21831}; GP=${GP:-19401}; HP=${HP:-19402}; WORKERS=${WORKERS:-64}
ONE="$(cd "$(dirname "$0")" && pwd)/one-rule.yaml"
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
bench_tool
bench_start_redis
C3=""; C6=""
for i in $(seq 0 2); do C3="$C3${C3:+,}127.0.0.1:$((CP + i))"; done
for i in $(seq 0 5); do C6="$C6${C6:+,}127.0.0.1:$((CP + 10 + i))"; done
cluster_down() {
  local a
  for a in ${C3//,/ } ${C6//,/ }; do redis-cli -p "${a##*:}" shutdown nosave >/dev/null 2>&1; done
  bench_cleanup
}
trap cluster_down EXIT
cluster_up() { # addrs
  local a p
  for a in ${1//,/ }; do
    p=${a##*:}
    if (echo > "/dev/tcp/127.0.0.1/$p") 2>/dev/null || (echo > "/dev/tcp/127.0.0.1/$((p + 10000))") 2>/dev/null; then
      echo "port $p or its bus port $((p + 10000)) is in use: set CP" >&2; exit 1
    fi
    mkdir -p "$OUT/node$p"
    (cd "$OUT/node$p" && redis-server --port "$p" --cluster-enabled yes --cluster-config-file nodes.conf \
      --save '' --appendonly no --daemonize yes --logfile "$OUT/node$p/redis.log")
  done
  for a in ${1//,/ }; do
    for _ in $(seq 50); do redis-cli -p "${a##*:}" ping >/dev/null 2>&1 && break; sleep 0.1; done
  done
  # shellcheck disable=SC2086
  redis-cli --cluster create ${1//,/ } --cluster-replicas 0 --cluster-yes >"$OUT/create-${1##*:}.log" 2>&1 || {
    echo "redis-cli --cluster create $1 failed (see $OUT/create-${1##*:}.log)" >&2; exit 1; }
  for _ in $(seq 100); do
    redis-cli -p "${1##*:}" cluster info | grep -q cluster_state:ok && return 0
    sleep 0.1
  done
  echo "cluster $1 never reported cluster_state:ok" >&2; exit 1
}
cluster_up "$C3"
cluster_up "$C6"
sleep 2 # every node's view settles
run() { # name addrs mode-args workers rate config bench-args...
  local name=$1 addrs=$2 mode=$3 workers=$4 rate=$5 cfg=$6 a; shift 6
  # shellcheck disable=SC2086
  "$BIN" serve --backend redis --redis-addr "$addrs" $mode --grpc-addr 127.0.0.1:$GP --http-addr 127.0.0.1:$HP \
    --log-level warn $cfg > "$OUT/srv.log" 2>&1 &
  SRV_PID=$!
  bench_server_up "$name" || return
  for a in ${addrs//,/ }; do redis-cli -p "${a##*:}" flushall >/dev/null; done
  "$BENCH" --addr 127.0.0.1:$GP --duration 8s --concurrency "$workers" --rate "$rate" --users 100000 --hot 0 --quiet --json \
    --server-pid "$SRV_PID" --redis-addr "$addrs" "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"
  bench_server_down
}
for r in $(seq "$ROUNDS"); do
  for topo in ${TOPO:-standalone c3 c6 c3-perkey}; do
    base=$topo; win=""; rate=0; workers=$WORKERS
    case $base in *+w*) win=${base#*+w}; base=${base%%+w*} ;; esac
    case $base in *~*) rate=${base#*~}; base=${base%%~*} ;; esac
    case $base in *@*) workers=${base#*@}; base=${base%%@*} ;; esac
    case $base in
      standalone) addrs=127.0.0.1:$RP; mode="" ;;
      c3) addrs=$C3; mode="--redis-mode cluster" ;;
      c6) addrs=$C6; mode="--redis-mode cluster" ;;
      c3-perkey) addrs=$C3; mode="--redis-mode cluster --redis-autopipeline=false" ;;
      *) echo "unknown topology $topo" >&2; continue ;;
    esac
    [ -n "$win" ] && mode="$mode --redis-batch-window $win"
    for sc in ${SCEN:-one-uni ex-uni}; do
      case $sc in
        one-uni) run "$topo-one-uni-r$r" "$addrs" "$mode" "$workers" "$rate" "--config $ONE" ;;
        ex-uni) run "$topo-ex-uni-r$r" "$addrs" "$mode" "$workers" "$rate" "" ;;
        *) echo "unknown scenario $sc" >&2 ;;
      esac
    done
  done
done
"$(dirname "$0")/bench-medians.py" "$OUT"
