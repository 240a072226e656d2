// Package monitoring holds no Go code: the directory ships flashgate's
// monitoring kit, and its tests prove each file against a running serve.
//
// grafana/flashgate.json is a Grafana dashboard (its Prometheus data source
// a variable): checks by decision and rule, denial share, latency
// quantiles, Redis latency, budget and errors, the breaker, failure-mode
// decisions, fleet size, bans, reloads, the HTTP front-end's rejects and
// the RLS. docs/operations-monitoring.md says what each panel means and
// what to do.
//
// alerts.yaml is a Prometheus rules file of alerts, each with a runbook's
// summary and description: Redis failing or slow, the breaker open or
// flapping, failure-mode decisions rising, the fleet shrinking, reloads
// failing, a rule denying an unusual share of all traffic; recording rules
// add up ext_authz's and the ratelimit service's counters per job.
// prometheusrule.yaml holds the same groups for the Prometheus Operator,
// and alerts_test.yaml is their `promtool test rules` suite.
//
// TestDashboard checks the dashboard's shape (schema, data source variable,
// ids, grid, a panel for each thing watched). TestMonitoring builds
// flashgate, runs `serve` on the memory backend and on a redis-server of
// its own, drives both through the events the metrics count (checks
// allowed and denied, a request the HTTP front-end rejects, RLS calls, a
// failed and a good reload of each config, a ban added and lifted with
// `flashgate bans`, Redis killed under traffic), scrapes /metrics, and
// fails for any metric that a dashboard query or an alert expression,
// parsed with Prometheus's PromQL parser, names and no process exported; it
// also runs `promtool check rules` and `promtool test rules` (promtool
// missing fails the test with how to install it). TestAlerts checks each
// alert's labels and annotations, the PrometheusRule against alerts.yaml,
// and that alerts_test.yaml has a case firing each alert and one not.
// TestOperationsDoc checks that docs/operations-monitoring.md explains
// every panel and every alert, and runs its prometheus.yml, with the alerts,
// through `promtool check config`.
//
// The directory is a Go module of its own, so that Prometheus's PromQL
// parser stays out of the sidecar's module; it builds flashgate from the
// root.
package monitoring
