#!/bin/bash
# The textbook script served end to end the way flashgate serves its own (issue 11; BENCHMARKS.md §12).
# usage: scripts/textbook-e2e.sh OUTDIR ROUNDS
#
# Builds two binaries of this checkout: flashgate as it is, and one with scripts/textbook-e2e.patch applied
# (in a throwaway worktree). The patched one sends every one-key check as its own EVALSHA of the textbook
# script (../shared/reference/sliding_window.lua, or $TEXTBOOK), the checks queued behind a call in flight
# written together in one pipeline (as redis-benchmark -P does), and turns its 1/0 into flashgate's reply.
# Then scripts/bench-cost.sh runs both, alternated, on the same load (SCEN, default "one-uni one-paced":
# one rule, 32 workers, uniform over 100,000 users; and 3000 checks/s): the same load generator, gRPC
# server, auto-pipeline and Redis, so the Redis CPU per check differs only by the script and the batching.
# The patch is a measurement harness, not part of flashgate; it applies to window/pipeline.go as of
# the commit that added it (rebase it when that file changes).
set -eu
cd "$(dirname "$0")/.."
OUT=$1; ROUNDS=$2
TEXTBOOK=${TEXTBOOK:-$(cd .. && pwd)/shared/reference/sliding_window.lua}
[ -r "$TEXTBOOK" ] || { echo "no textbook script at $TEXTBOOK (set TEXTBOOK)" >&2; exit 1; }
W=$(mktemp -d)
trap 'git worktree remove --force "$W/src" >/dev/null 2>&1; rm -rf "$W"' EXIT
git worktree add --detach "$W/src" HEAD >/dev/null 2>&1
git -C "$W/src" apply "$PWD/scripts/textbook-e2e.patch"
(cd "$W/src" && go build -o "$W/textbook.bin" ./cmd/flashgate)
go build -o "$W/fg_flashgate" ./cmd/flashgate
printf '#!/bin/sh\nFG_TEXTBOOK=%s exec %s "$@"\n' "$TEXTBOOK" "$W/textbook.bin" > "$W/fg_textbook"
chmod +x "$W/fg_textbook"
SCEN=${SCEN:-one-uni one-paced} scripts/bench-cost.sh "$OUT" "$ROUNDS" "$W/fg_flashgate" "$W/fg_textbook"
