#!/bin/bash
# The textbook script served end to end the way flashgate serves its own (BENCHMARKS.md, "Redis cost per check").
# usage: scripts/textbook-e2e.sh OUTDIR ROUNDS
#
# Builds two binaries of this checkout's HEAD in a throwaway worktree (and the load generator, flashgate-bench,
# unless $BENCH names one): flashgate as it is, and one with
# scripts/textbook-e2e.patch applied. The patched one sends every one-key check as its own EVALSHA of the textbook
# script (../shared/reference/sliding_window.lua, or $TEXTBOOK), the checks queued behind a call in flight
# written together in one pipeline (as redis-benchmark -P does), and turns its 1/0 into flashgate's reply.
# Then scripts/bench-cost.sh runs both, alternated, on the same load (SCEN, one-key scenarios only; default
# "one-uni one-paced":
# one rule, 32 workers, uniform over 100,000 users; and 3000 checks/s): the same load generator, gRPC
# server, auto-pipeline and Redis, so the Redis CPU per check differs only by the script and the batching.
# The patch is a measurement harness, not part of flashgate; it applies to window/redisstore/pipeline.go as of
# the commit that added it (rebase it when that file changes).
set -eu
[ $# -eq 2 ] || { echo "usage: $0 OUTDIR ROUNDS" >&2; exit 2; }
case " ${SCEN:-one-uni one-paced} " in
  *" ex-"*|*noop*) echo "SCEN: the patch serves one-key checks only (one-uni, one-uni-env, one-hot, one-paced)" >&2; exit 2 ;;
esac
mkdir -p "$1"; OUT=$(cd "$1" && pwd); ROUNDS=$2
REPO=$(cd "$(dirname "$0")/.." && pwd)
TEXTBOOK=${TEXTBOOK:-$REPO/../shared/reference/sliding_window.lua}
[ -r "$TEXTBOOK" ] || { echo "no textbook script at $TEXTBOOK (set TEXTBOOK)" >&2; exit 1; }
TEXTBOOK=$(cd "$(dirname "$TEXTBOOK")" && pwd)/$(basename "$TEXTBOOK")
W=$(mktemp -d)
trap 'git -C "$REPO" worktree remove --force "$W/src" >/dev/null 2>&1; rm -rf "$W"' EXIT
# Both binaries from HEAD (uncommitted changes are in neither): flashgate as it is, then with the patch.
git -C "$REPO" worktree add --quiet --detach "$W/src" HEAD
(cd "$W/src" && go build -o "$W/fg_flashgate" ./cmd/flashgate)
[ -n "${BENCH:-}" ] || { (cd "$W/src" && go build -o "$W/flashgate-bench" ./cmd/flashgate-bench); BENCH=$W/flashgate-bench; }
git -C "$W/src" apply "$REPO/scripts/textbook-e2e.patch"
(cd "$W/src" && go build -o "$W/textbook.bin" ./cmd/flashgate)
printf '#!/bin/sh\nFG_TEXTBOOK='"'"'%s'"'"' exec '"'"'%s'"'"' "$@"\n' "$TEXTBOOK" "$W/textbook.bin" > "$W/fg_textbook"
chmod +x "$W/fg_textbook"
BENCH=$BENCH SCEN=${SCEN:-one-uni one-paced} "$REPO/scripts/bench-cost.sh" "$OUT" "$ROUNDS" "$W/fg_flashgate" "$W/fg_textbook"
