#!/bin/bash
# The textbook script served end to end the way flashgate serves its own (BENCHMARKS.md, "Redis cost per check").
# usage: scripts/textbook-e2e.sh OUTDIR ROUNDS
#
# Builds two binaries of this checkout's HEAD in a throwaway worktree (and the load generator, flashgate-bench,
# unless $BENCH names one): flashgate as it is, and one with the patch below (inline) applied. The patched one
# sends every one-key check as its own EVALSHA of the textbook script (../shared/reference/sliding_window.lua,
# or $TEXTBOOK), the checks queued behind a call in flight written together in one pipeline (as
# redis-benchmark -P does), and turns its 1/0 into flashgate's reply.
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
git -C "$W/src" apply <<'PATCH'
diff --git a/window/redisstore/pipeline.go b/window/redisstore/pipeline.go
index bfafd53..4af1de1 100644
--- a/window/redisstore/pipeline.go
+++ b/window/redisstore/pipeline.go
@@ -4,6 +4,7 @@ import (
 	"context"
 	"errors"
 	"fmt"
+	"os"
 	"slices"
 	"sync"
 	"sync/atomic"
@@ -68,6 +69,8 @@ type autoPipeline struct {
 	// calls pools the queued calls (see pipelineCall.done).
 	calls sync.Pool
 
+	tb *textbook // scratch: see textbook_scratch.go
+
 	alwaysQueue        bool
 	stallMin, stallMax time.Duration
 	// window is the batch window, ns: a call queued while none is in
@@ -182,6 +185,13 @@ func newAutoPipeline(client Client, script *script, tune pipelineTuning) *autoPi
 		hold:        int64(tune.hold),
 		held:        -1 << 62, // no hold before the first batch
 		opened:      -1 << 62,
+		tb:          newTextbook(),
+	}
+	if p.tb != nil {
+		if err := p.tb.script.Load(ctx, client).Err(); err != nil {
+			fmt.Fprintln(os.Stderr, "FG_TEXTBOOK: SCRIPT LOAD:", err)
+			os.Exit(2)
+		}
 	}
 	for i := range p.slots {
 		p.wg.Go(func() { p.dispatch(i) })
@@ -230,7 +240,7 @@ func (p *autoPipeline) run(ctx context.Context, by time.Time, keys []string, arg
 				ectx, cancel = context.WithDeadline(ctx, by)
 				defer cancel()
 			}
-			res, err := p.script.eval(ectx, p.client, keys, args)
+			res, err := p.evalx(ectx, p.client, keys, args)
 			p.release(now, 1, -1)
 			return res, err
 		}
@@ -551,9 +561,13 @@ func (p *autoPipeline) send(batch []*pipelineCall) {
 	ctx, cancel := context.WithDeadline(p.ctx, deadline)
 	defer cancel()
 
+	if p.tb != nil && len(batch) > 1 {
+		p.tb.send(ctx, p.client, batch)
+		return
+	}
 	if len(batch) == 1 {
 		c := batch[0]
-		res, err := p.script.eval(ctx, p.client, c.keys, c.args)
+		res, err := p.evalx(ctx, p.client, c.keys, c.args)
 		c.finish(c.gen, res, err, true)
 		return
 	}
@@ -567,7 +581,7 @@ func (p *autoPipeline) send(batch []*pipelineCall) {
 		keys = append(keys, c.keys...)
 		args = append(args, c.args...)
 	}
-	res, err := p.script.eval(ctx, p.client, keys, args)
+	res, err := p.evalx(ctx, p.client, keys, args)
 	var rerr redis.Error
 	if errors.As(err, &rerr) {
 		p.sendEach(ctx, batch)
@@ -648,3 +662,12 @@ func (p *autoPipeline) close() {
 	}
 	p.wg.Wait()
 }
+
+// evalx is the script call of one request or batch: flashgate's script, or
+// with FG_TEXTBOOK the textbook's (one request only).
+func (p *autoPipeline) evalx(ctx context.Context, c Client, keys []string, args []any) ([]any, error) {
+	if p.tb != nil {
+		return p.tb.eval(ctx, c, keys, args)
+	}
+	return p.script.eval(ctx, c, keys, args)
+}
diff --git a/window/redisstore/textbook_scratch.go b/window/redisstore/textbook_scratch.go
new file mode 100644
index 0000000..daa44fd
--- /dev/null
+++ b/window/redisstore/textbook_scratch.go
@@ -0,0 +1,82 @@
+package redisstore
+
+// Scratch, for measurement only (scripts/textbook-e2e.sh applies it in a
+// throwaway worktree; it is not part of flashgate): with FG_TEXTBOOK set to
+// the path of ../shared/reference/sliding_window.lua, the auto-pipeline
+// sends every queued one-key check as its own EVALSHA of that textbook
+// script, the checks queued together written in one go-redis pipeline (one
+// write, as redis-benchmark -P does), and a check sent alone as one EVALSHA.
+// Its reply (1 admitted, 0 refused) is turned into flashgate's.
+
+import (
+	"context"
+	"encoding/binary"
+	"fmt"
+	"os"
+	"strconv"
+	"time"
+
+	"github.com/redis/go-redis/v9"
+)
+
+type textbook struct{ script *redis.Script }
+
+func newTextbook() *textbook {
+	path := os.Getenv("FG_TEXTBOOK")
+	if path == "" {
+		return nil
+	}
+	src, err := os.ReadFile(path)
+	if err != nil {
+		fmt.Fprintln(os.Stderr, "FG_TEXTBOOK:", err)
+		os.Exit(2)
+	}
+	return &textbook{script: redis.NewScript(string(src))}
+}
+
+// tbArgs: flashgate's args [member, now, 1, spec] (the spec: limit uint32, window µs uint64, … as
+// appendHitArgs writes it) → the textbook's [now (ignored), window ms, limit, member].
+func tbArgs(args []any) (ms, limit int64, out []any) {
+	s := args[3].(string)
+	limit = int64(binary.LittleEndian.Uint32([]byte(s[0:4])))
+	ms = int64(binary.LittleEndian.Uint64([]byte(s[4:12]))) / 1000
+	return ms, limit, []any{0, ms, limit, args[0]}
+}
+
+// tbReply: the textbook's 1 (admitted) or 0 (refused) → flashgate's [now, count, retry-after µs].
+func tbReply(v int64, ms, limit int64) []any {
+	now := strconv.FormatInt(time.Now().UnixMicro(), 10)
+	if v == 1 {
+		return []any{now, int64(1), int64(0)}
+	}
+	return []any{now, limit, ms * 1000}
+}
+
+func (t *textbook) eval(ctx context.Context, c Client, keys []string, args []any) ([]any, error) {
+	ms, limit, a := tbArgs(args)
+	v, err := t.script.Run(ctx, c, keys, a...).Int64()
+	if err != nil {
+		return nil, err
+	}
+	return tbReply(v, ms, limit), nil
+}
+
+func (t *textbook) send(ctx context.Context, c Client, batch []*pipelineCall) {
+	pipe := c.Pipeline()
+	cmds := make([]*redis.Cmd, len(batch))
+	lims := make([][2]int64, len(batch))
+	for i, call := range batch {
+		ms, limit, a := tbArgs(call.args)
+		lims[i] = [2]int64{ms, limit}
+		cmds[i] = pipe.EvalSha(ctx, t.script.Hash(), call.keys, a...)
+	}
+	_, _ = pipe.Exec(ctx)
+	for i, call := range batch {
+		v, err := cmds[i].Int64()
+		if err != nil {
+			call.finish(call.gen, nil, err, true)
+			continue
+		}
+		call.finish(call.gen, tbReply(v, lims[i][0], lims[i][1]), nil, true)
+	}
+}
PATCH
(cd "$W/src" && go build -o "$W/textbook.bin" ./cmd/flashgate)
printf '#!/bin/sh\nFG_TEXTBOOK='"'"'%s'"'"' exec '"'"'%s'"'"' "$@"\n' "$TEXTBOOK" "$W/textbook.bin" > "$W/fg_textbook"
chmod +x "$W/fg_textbook"
BENCH=$BENCH SCEN=${SCEN:-one-uni one-paced} "$REPO/scripts/bench-cost.sh" "$OUT" "$ROUNDS" "$W/fg_flashgate" "$W/fg_textbook"
