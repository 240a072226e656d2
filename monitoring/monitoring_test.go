package monitoring

import "testing"

// TestMonitoring starts flashgate serve on the memory backend and on Redis,
// drives each through the events its metrics count (checks allowed and
// denied, a rejected HTTP request, RLS calls, failed and successful
// reloads, a ban added and lifted, a Redis outage), and checks that every
// metric the dashboard names was exported.
func TestMonitoring(t *testing.T) {
	series := exportedSeries(t)
	t.Run("dashboard", func(t *testing.T) {
		requireExported(t, dashboardFile, dashboardMetrics(t, loadDashboard(t)), series)
	})
	t.Run("alerts", func(t *testing.T) {
		promtool(t, "check", "rules", alertsFile)
		promtool(t, "test", "rules", alertsTestFile)
		requireExported(t, alertsFile, alertMetrics(t, alertRules(t)), series)
	})
}
