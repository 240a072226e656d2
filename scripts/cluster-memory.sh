#!/bin/bash
# Redis memory per active limit key, standalone against a Cluster node (BENCHMARKS.md, "Redis Cluster at
# standalone's cost").
# usage: scripts/cluster-memory.sh PORT CLUSTERPORT [N] [ENTRIES]
#   PORT: a standalone redis-server; CLUSTERPORT: a cluster-enabled redis-server serving every slot (a
#   one-master Cluster: CLUSTER ADDSLOTSRANGE 0 16383). Both are flushed.
# Writes N keys (default 100000) shaped as serve makes them ("fg:{6 hex}:coupon_per_uid:user-I"), each a
# sorted set of ENTRIES entries (default 1: a uniform user of the one-rule benchmark; 5: a full 5/1s window)
# with 9-byte member ids and µs scores, PEXPIRE one hour, and prints used_memory's growth per key on each.
set -eu
P=$1; CP=$2; N=${3:-100000}; E=${4:-1}
used() { redis-cli -p "$1" info memory | tr -d '\r' | awk -F: '/^used_memory:/{print $2}'; }
fill() { # port
  redis-cli -p "$1" flushall >/dev/null
  local before after
  before=$(used "$1")
  awk -v n="$N" -v e="$E" 'BEGIN {
    for (i = 0; i < n; i++) {
      k = sprintf("fg:{%06x}:coupon_per_uid:user-%d", (i * 2654435761) % 16777216, i)
      printf "ZADD %s", k
      for (j = 0; j < e; j++) printf " 17964737%08d m%08d", i % 100000000 + j, i * 8 + j
      printf "\r\nPEXPIRE %s 3600000\r\n", k
    }
  }' | redis-cli -p "$1" --pipe >/dev/null
  after=$(used "$1")
  echo "$after $before"
}
read -r sa sb < <(fill "$P")
read -r ca cb < <(fill "$CP")
awk -v n="$N" -v e="$E" -v sa="$sa" -v sb="$sb" -v ca="$ca" -v cb="$cb" 'BEGIN {
  printf "keys: %d of %d entries\nstandalone: %.1f bytes per key\ncluster node: %.1f bytes per key\n", n, e, (sa - sb) / n, (ca - cb) / n
}'
