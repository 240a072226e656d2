#!/bin/bash
# Redis's cost per check beneath a fleet: N flashgate sidecars against N envoyproxy/ratelimit processes on one
# Redis (BENCHMARKS.md, "Beneath a fleet").
# usage: scripts/bench-fleet.sh OUTDIR ROUNDS FLASHGATE_BIN [RATELIMIT_BIN]
#   FLASHGATE_BIN: go build -o /tmp/fg ./cmd/flashgate (several, comma-separated: each a fleet of its own)
#   RATELIMIT_BIN: envoyproxy/ratelimit's service_cmd, built here from the Go module proxy when not given
#                  (RL_VERSION; scripts/bench-lib.sh); RL=none leaves ratelimit out
# Settings (environment):
#   N=12        processes per fleet           C=2      calls in flight per process (the load's workers: N × C)
#   RATE=1500   checks per second, in all      USERS=100000  uniform users (one uid descriptor each)
#   DUR=10s     per run                        SHARED=  also a fleet fg-sharedS of S flashgate processes (the
#                                                       shared-service shape: the same N × C callers spread over
#                                                       S processes, the first FLASHGATE_BIN)
#   FG_ARGS     flags for every flashgate serve (default --check-deadline 2s --redis-timeout 1s: on a loaded box
#               the default 40 ms deadline sends checks to the failure mode, and the run would measure the
#               fallback and its write-back, not the check; ratelimit waits for Redis however long it takes;
#               the script says if a sidecar logged a check decided by its failure mode)
#   IDLE=5      seconds of the idle run (0: none), see below
# Every process of every fleet starts at once on one redis-server of the script's own (RP), then all are
# paused (SIGSTOP). Per round, each fleet in turn is resumed, Redis flushed, and flashgate-bench (one load
# generator, paced to RATE, its workers spread over the fleet's processes: worker i calls process i mod N)
# sends ShouldRateLimit (domain flashsale, one uid descriptor: 5 per second per uid; flashgate serves it
# with --rls-config) for DUR; then the fleet is paused again. Both fleets thus run on the same box, one at a
# time, alternating round by round. Its JSON goes to OUTDIR/FLEET-rROUND.json: redis_cpu_us_per_check (INFO
# cpu), redis_commands_per_check (INFO stats: every command, a script's own included),
# server_cpu_us_per_check (the sum over the fleet's processes, /proc), p50/p99. The medians are printed
# at the end (scripts/bench-medians.py), and each flashgate fleet's figures over ratelimit's, per round.
# Per run also the fleet's scheduling per check (/proc/PID/task/*/schedstat, every thread of its processes):
# time slices (each a thread woken or resumed) and run-queue wait, the delay a starved box adds, in
# OUT/FLEET-rROUND.sched; their medians are printed at the end.
# The idle run (per flashgate fleet, after the rounds): its processes resumed, no load, for IDLE seconds;
# it prints what their background work (fleet heartbeat, ban sync) costs Redis per sidecar and second,
# Redis's own CPU over as long with every fleet paused (its cron) taken off.
# Ports: RP (Redis), from BP up (gRPC, HTTP, ratelimit's debug: three per process); the script refuses
# ports already in use.
set -u
OUT=$1; ROUNDS=$2; FGS=$3; RL=${4:-}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
N=${N:-12}; C=${C:-2}; RATE=${RATE:-1500}; USERS=${USERS:-100000}; DUR=${DUR:-10s}; SHARED=${SHARED:-}
FG_ARGS=${FG_ARGS---check-deadline 2s --redis-timeout 1s}; IDLE=${IDLE:-5}
RP=${RP:-64711}; BP=${BP:-25000}
# bench-lib.sh's port checks: the first ports of the range.
GP=$BP; HP=$((BP + 1))
# shellcheck source=scripts/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
if [ "$RL" != none ]; then
  bench_ratelimit_bin "$RL"
fi
bench_ratelimit_config
bench_tool
bench_start_redis
declare -A PIDS ADDRS # fleet name -> its PIDs, its gRPC addresses (comma-separated)
ALL=()
fleet_cleanup() {
  local p
  for p in "${ALL[@]}"; do kill -CONT "$p" 2>/dev/null; kill "$p" 2>/dev/null; done
  for p in "${ALL[@]}"; do wait "$p" 2>/dev/null; done
  bench_cleanup
}
trap fleet_cleanup EXIT
port=$BP
# start_fleet NAME KIND(fg|rl) COUNT BIN: starts COUNT processes, each on three ports of its own.
start_fleet() {
  local name=$1 kind=$2 count=$3 bin=$4 i pids="" addrs=""
  for i in $(seq "$count"); do
    local g=$port h=$((port + 1)) d=$((port + 2))
    port=$((port + 3))
    for p in $g $h $d; do
      if (echo > "/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "port $p is in use: set BP" >&2; exit 1; fi
    done
    case $kind in
      rl) env USE_STATSD=false LOG_LEVEL=error REDIS_SOCKET_TYPE=tcp REDIS_URL=127.0.0.1:$RP \
            RUNTIME_ROOT="$OUT/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
            GRPC_HOST=127.0.0.1 GRPC_PORT=$g HOST=127.0.0.1 PORT=$h DEBUG_HOST=127.0.0.1 DEBUG_PORT=$d \
            "$bin" > "$OUT/$name-$i.log" 2>&1 & ;;
      # shellcheck disable=SC2086 # FG_ARGS is a list of flags
      fg) "$bin" serve --backend redis --redis-addr 127.0.0.1:$RP --grpc-addr 127.0.0.1:$g --http-addr 127.0.0.1:$h \
            --rls-config "$OUT/runtime/ratelimit" --log-level warn $FG_ARGS > "$OUT/$name-$i.log" 2>&1 & ;;
    esac
    ALL+=($!)
    pids+=${pids:+,}$!
    addrs+=${addrs:+,}127.0.0.1:$g
  done
  PIDS[$name]=$pids
  ADDRS[$name]=$addrs
}
# wait_fleet NAME: every process listens, or the script ends.
wait_fleet() {
  local name=$1 a p
  for a in ${ADDRS[$name]//,/ }; do
    for _ in $(seq 300); do (echo > "/dev/tcp/${a%:*}/${a##*:}") 2>/dev/null && break; sleep 0.2; done
    (echo > "/dev/tcp/${a%:*}/${a##*:}") 2>/dev/null || { echo "$name: $a does not listen (see $OUT/$name-*.log)" >&2; exit 1; }
  done
  for p in ${PIDS[$name]//,/ }; do kill -0 "$p" 2>/dev/null || { echo "$name: process $p ended" >&2; exit 1; }; done
}
# sched_snap PIDS: the sum over every thread of the processes PIDS (comma-separated) of schedstat's
# run time (ns), run-queue wait (ns) and time slices.
sched_snap() {
  local p
  for p in ${1//,/ }; do cat /proc/"$p"/task/*/schedstat 2>/dev/null; done |
    awk '{r += $1; w += $2; s += $3} END {printf "%d %d %d\n", r, w, s}'
}
signal_fleet() { # NAME SIGNAL
  local p
  for p in ${PIDS[$1]//,/ }; do kill "-$2" "$p"; done
}
FLEETS=()
k=0
for bin in ${FGS//,/ }; do
  k=$((k + 1))
  name=fg; [ "$k" -gt 1 ] && name=fg$k
  start_fleet "$name" fg "$N" "$bin"
  FLEETS+=("$name")
done
if [ -n "$SHARED" ]; then
  bin=${FGS%%,*}
  start_fleet "fg-shared$SHARED" fg "$SHARED" "$bin"
  FLEETS+=("fg-shared$SHARED")
fi
if [ "$RL" != none ]; then
  start_fleet rl rl "$N" "$RL"
  FLEETS+=(rl)
fi
for f in "${FLEETS[@]}"; do wait_fleet "$f"; done
sleep 2 # the sidecars' first heartbeats and warm-ups
for f in "${FLEETS[@]}"; do signal_fleet "$f" STOP; done
echo "fleets: ${FLEETS[*]}; N=$N C=$C RATE=$RATE USERS=$USERS DUR=$DUR SHARED=$SHARED FG_ARGS=$FG_ARGS; load: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  for f in "${FLEETS[@]}"; do
    signal_fleet "$f" CONT
    redis-cli -p "$RP" flushall >/dev/null
    sleep 1
    s0=$(sched_snap "${PIDS[$f]}")
    "$BENCH" --api rls --addr "${ADDRS[$f]}" --server-pid "${PIDS[$f]}" --redis-addr 127.0.0.1:$RP \
      --duration "$DUR" --concurrency $((N * C)) --connections 1 --rate "$RATE" --users "$USERS" --quiet --json \
      > "$OUT/$f-r$r.json" 2> "$OUT/$f-r$r.err"
    echo "$s0 $(sched_snap "${PIDS[$f]}")" > "$OUT/$f-r$r.sched"
    signal_fleet "$f" STOP
    echo "round $r $f done; load: $(cut -d' ' -f1-3 /proc/loadavg)"
  done
done
"$(dirname "$0")/bench-medians.py" "$OUT"
status=$?
if grep -l 'deciding by failure mode' "$OUT"/fg*.log 2>/dev/null | head -3 | grep -q .; then
  echo "warning: sidecars decided checks by their failure mode (see $OUT/fg*.log): their figures include it" >&2
fi
python3 - "$OUT" "${FLEETS[@]}" <<'PY'
import json, statistics, sys
out, fleets = sys.argv[1], sys.argv[2:]
print("\nscheduling per check, median over rounds: time slices, run-queue wait µs (every thread of the fleet)")
for f in fleets:
    sl, wt = [], []
    for r in range(1, 1000):
        try:
            a = [int(x) for x in open(f"{out}/{f}-r{r}.sched").read().split()]
            n = json.load(open(f"{out}/{f}-r{r}.json"))["requests"]
        except (OSError, ValueError, KeyError):
            break
        if n > 0 and len(a) == 6:
            sl.append((a[5] - a[2]) / n)
            wt.append((a[4] - a[1]) / n / 1e3)
    if sl:
        print(f"{f:20s} {statistics.median(sl):6.2f} slices {statistics.median(wt):8.0f} µs wait")
PY
if [ "$RL" != none ]; then
  python3 - "$OUT" "${FLEETS[@]}" <<'PY'
import json, statistics, sys
out, fleets = sys.argv[1], sys.argv[2:]
def load(f, r):
    try:
        return json.load(open(f"{out}/{f}-r{r}.json"))
    except (OSError, ValueError):
        return None
print("\nover ratelimit's, per round: median (min-max)")
for f in fleets:
    if f == "rl":
        continue
    for what, key in (("Redis µs", "redis_cpu_us_per_check"), ("commands", "redis_commands_per_check"),
                      ("process µs", "server_cpu_us_per_check")):
        rs, r = [], 1
        while True:
            a, b = load(f, r), load("rl", r)
            if a is None and b is None and r > 1:
                break
            if a and b and b.get(key):
                rs.append(a.get(key, 0) / b[key])
            r += 1
            if r > 1000:
                break
        if rs:
            print(f"{f:20s} {what:11s} {statistics.median(rs):5.2f} ({min(rs):.2f}-{max(rs):.2f})")
    rs = []
    for r in range(1, 1000):
        a, b = load(f, r), load("rl", r)
        if not (a and b):
            break
        ta = a.get("redis_cpu_us_per_check", 0) + a.get("server_cpu_us_per_check", 0)
        tb = b.get("redis_cpu_us_per_check", 0) + b.get("server_cpu_us_per_check", 0)
        rs.append(ta / tb)
    if rs:
        print(f"{f:20s} {'Redis+proc':11s} {statistics.median(rs):5.2f} ({min(rs):.2f}-{max(rs):.2f})")
PY
fi
if [ "$IDLE" -gt 0 ]; then
  # Redis's own CPU with every fleet paused (its cron), taken off the idle runs' CPU.
  redis-cli -p "$RP" flushall >/dev/null
  redis-cli -p "$RP" info all > "$OUT/paused-before.txt"
  sleep "$IDLE"
  redis-cli -p "$RP" info all > "$OUT/paused-after.txt"
  for f in "${FLEETS[@]}"; do
    [ "$f" = rl ] && continue
    signal_fleet "$f" CONT
    sleep 1
    redis-cli -p "$RP" info all > "$OUT/$f-idle-before.txt"
    sleep "$IDLE"
    redis-cli -p "$RP" info all > "$OUT/$f-idle-after.txt"
    signal_fleet "$f" STOP
    n=$(echo "${PIDS[$f]//,/ }" | wc -w)
    python3 - "$OUT/$f-idle-before.txt" "$OUT/$f-idle-after.txt" "$n" "$IDLE" "$f" "$OUT"/paused-{before,after}.txt <<'PY'
import re, sys
def parse(p):
    cpu, cmds, total = 0.0, {}, 0
    for line in open(p):
        line = line.strip()
        if line.startswith(("used_cpu_sys:", "used_cpu_user:")):
            cpu += float(line.split(":")[1])
        elif line.startswith("total_commands_processed:"):
            total = int(line.split(":")[1])
        m = re.match(r"cmdstat_(\w+):calls=(\d+)", line)
        if m:
            cmds[m.group(1)] = int(m.group(2))
    return cpu, cmds, total
(c0, m0, t0), (c1, m1, t1) = parse(sys.argv[1]), parse(sys.argv[2])
base = parse(sys.argv[7])[0] - parse(sys.argv[6])[0]
n, s, f = int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
per = lambda v: v / n / s
d = {k: m1[k] - m0.get(k, 0) for k in m1 if m1[k] - m0.get(k, 0) > 0}
d["info"] = d.get("info", 0) - 1  # the script's own INFO
top = ", ".join(f"{k} {per(v):.2f}" for k, v in sorted(d.items(), key=lambda kv: -kv[1]) if v > 0)
print(f"\n{f} idle: per sidecar per second, {per(t1 - t0 - 1):.2f} commands ({top}), Redis CPU {per(c1 - c0 - base) * 1e6:.1f} µs "
      f"(less {base / s * 1e6:.0f} µs/s of Redis's own with every fleet paused)")
PY
  done
fi
exit $status
