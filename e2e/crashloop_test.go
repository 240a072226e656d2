package e2e

import (
	"testing"
	"time"

	"github.com/flashgate/flashgate/window/redistest"
)

// TestFleetRedisFlaps: Redis crash-loops under the burst, killed and
// restarted empty five times (0.5 s down, 1.5 s up), each return sooner
// than a window after the admissions Redis forgot. Every return is held as
// the first is: no sidecar decides by the empty Redis before the fleet's
// local admissions are written back and the forgotten ones have left the
// window, so no window holds more than limit + N - 1 = 7, however many
// flaps; and Redis decides again once the loop ends.
func TestFleetRedisFlaps(t *testing.T) {
	rs := redistest.Start(t)
	procs := startFleet(t, 3, rs.Addr(), "e2eflaps")
	waitFleetSize(t, procs, 3, 5*time.Second)
	const flaps = 5
	var local, held, checks []float64
	runFleet(t, procs, 1500*time.Millisecond+flaps*2*time.Second+5*time.Second, fleetLimit+3-1, func() {
		for range flaps {
			rs.Kill()
			time.Sleep(500 * time.Millisecond)
			rs.Restart()
			time.Sleep(1500 * time.Millisecond)
		}
		waitTurnedBack(t, procs)
		local, held, checks = localChecks(procs)
	})
	redisDecidesSince(t, procs, local, held, checks)
}
