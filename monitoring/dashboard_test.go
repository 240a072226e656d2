package monitoring

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const dashboardFile = "grafana/flashgate.json"

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	Inputs        []dashboardInput `json:"__inputs"`
	Title         string           `json:"title"`
	UID           string           `json:"uid"`
	SchemaVersion int              `json:"schemaVersion"`
	Panels        []panel          `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID          int            `json:"id"`
	Type        string         `json:"type"`
	Title       string         `json:"title"`
	Description string         `json:"description"`
	Datasource  *datasourceRef `json:"datasource"`
	GridPos     struct{ X, Y, W, H int }
	Targets     []struct {
		RefID        string         `json:"refId"`
		Expr         string         `json:"expr"`
		LegendFormat string         `json:"legendFormat"`
		Datasource   *datasourceRef `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

type variable struct {
	Type       string          `json:"type"`
	Name       string          `json:"name"`
	Query      json.RawMessage `json:"query"`
	Definition string          `json:"definition"`
	Datasource *datasourceRef  `json:"datasource"`
	Current    struct {
		Value any `json:"value"`
	} `json:"current"`
}

// dashboardInput is an entry of __inputs: what Grafana's import asks for,
// then writes in place of ${NAME} wherever the JSON says it.
type dashboardInput struct {
	Name     string `json:"name"`
	Type     string `json:"type"`
	PluginID string `json:"pluginId"`
}

// dsInput is the data source input the import asks for; it becomes the
// datasource variable's value, which every panel and query uses.
const dsInput = "DS_PROMETHEUS"

// The dashboard's data source is a variable, so that it imports into any
// Grafana whatever its Prometheus is called.
const dsVar = "${datasource}"

func loadDashboard(t *testing.T) *dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return &d
}

// allPanels is every panel of d, those of collapsed rows included.
func (d *dashboard) allPanels() []panel {
	var out []panel
	for _, p := range d.Panels {
		out = append(out, p)
		out = append(out, p.Panels...)
	}
	return out
}

// dashboardMetrics parses every panel query and variable query of d and
// returns the metrics they name, each with where it is named.
func dashboardMetrics(t *testing.T, d *dashboard) map[string][]string {
	t.Helper()
	names := map[string][]string{}
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			where := fmt.Sprintf("panel %q query %s", p.Title, tg.RefID)
			expr, err := expand(tg.Expr)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			ms, err := metricNames(expr)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			for _, m := range ms {
				names[m] = append(names[m], where)
			}
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		where := fmt.Sprintf("variable %s", v.Name)
		ms, err := variableMetrics(v.Definition)
		if err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		for _, m := range ms {
			names[m] = append(names[m], where)
		}
	}
	return names
}

// TestDashboard checks the dashboard's shape: a recent schema, the data
// source as a variable everywhere, unique ids, panels on the grid without
// overlap, a description on each, and a panel for each thing an operator
// watches. TestMonitoring parses its queries against a running serve.
func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: both are needed for provisioning", d.UID, d.Title)
	}
	if d.SchemaVersion < 39 {
		t.Errorf("schemaVersion %d, want a recent Grafana's (≥ 39)", d.SchemaVersion)
	}

	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	ds, ok := vars["datasource"]
	if !ok || ds.Type != "datasource" || string(ds.Query) != `"prometheus"` {
		t.Errorf("templating: want a variable datasource of type datasource and query prometheus, got %+v", ds)
	}
	// Import asks for the Prometheus (__inputs) and sets the variable to
	// it; provisioned, the variable takes the default Prometheus.
	var in []dashboardInput
	for _, i := range d.Inputs {
		if i.Name == dsInput {
			in = append(in, i)
		}
	}
	if len(in) != 1 || in[0].Type != "datasource" || in[0].PluginID != "prometheus" {
		t.Errorf("__inputs: want one %s, a datasource of plugin prometheus, got %+v", dsInput, d.Inputs)
	}
	if ds.Current.Value != "${"+dsInput+"}" {
		t.Errorf("variable datasource: current value %v, want ${%s}: the import's choice", ds.Current.Value, dsInput)
	}
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`\$\{(DS_[A-Z_]+)\}`).FindAllSubmatch(raw, -1) {
		if !slices.ContainsFunc(d.Inputs, func(i dashboardInput) bool { return i.Name == string(m[1]) }) {
			t.Errorf("%s names ${%s}, which __inputs does not declare: import would leave it as is", dashboardFile, m[1])
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		if v.Datasource == nil || v.Datasource.UID != dsVar {
			t.Errorf("variable %s: datasource %+v, want uid %s", v.Name, v.Datasource, dsVar)
		}
		// Grafana runs query.query; definition is what it shows, and what
		// dashboardMetrics parses: the two must agree.
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil || q.Query != v.Definition {
			t.Errorf("variable %s: query %s (%v) differs from its definition %q", v.Name, v.Query, err, v.Definition)
		}
	}

	ids := map[int]string{}
	type cell struct{ x, y int }
	taken := map[cell]string{}
	for _, p := range d.allPanels() {
		if prev, dup := ids[p.ID]; dup || p.ID == 0 {
			t.Errorf("panel %q: id %d (also %q)", p.Title, p.ID, prev)
		}
		ids[p.ID] = p.Title
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v off Grafana's 24-column grid", p.Title, g)
		}
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if other, ok := taken[cell{x, y}]; ok {
					t.Errorf("panel %q overlaps panel %q at (%d,%d)", p.Title, other, x, y)
				}
				taken[cell{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			continue
		}
		if strings.TrimSpace(p.Description) == "" {
			t.Errorf("panel %q has no description (docs/operations-monitoring.md explains it at length)", p.Title)
		}
		if p.Datasource == nil || p.Datasource.UID != dsVar {
			t.Errorf("panel %q: datasource %+v, want uid %s", p.Title, p.Datasource, dsVar)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.Datasource == nil || tg.Datasource.UID != dsVar {
				t.Errorf("panel %q query %s: datasource %+v, want uid %s", p.Title, tg.RefID, tg.Datasource, dsVar)
			}
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("panel %q: refId %q empty or repeated", p.Title, tg.RefID)
			}
			refs[tg.RefID] = true
			if expr, err := expand(tg.Expr); err == nil {
				if err := legendLabelsKept(expr, tg.LegendFormat); err != nil {
					t.Errorf("panel %q query %s: %v", p.Title, tg.RefID, err)
				}
			}
			if !strings.Contains(tg.Expr, `job=~"$job"`) || !strings.Contains(tg.Expr, `instance=~"$instance"`) {
				t.Errorf("panel %q query %s ignores the job or instance variable: %s", p.Title, tg.RefID, tg.Expr)
			}
		}
	}

	// What an operator watches, each by the metric that shows it.
	names := dashboardMetrics(t, d)
	for what, metric := range map[string]string{
		"checks by decision and rule":    "flashgate_checks_total",
		"check latency quantiles":        "flashgate_check_duration_seconds_bucket",
		"Redis latency quantiles":        "flashgate_redis_duration_seconds_bucket",
		"Redis budget":                   "flashgate_redis_budget_seconds",
		"Redis errors":                   "flashgate_backend_errors_total",
		"breaker state":                  "flashgate_breaker_open",
		"breaker openings":               "flashgate_breaker_opened_total",
		"failure-mode decisions":         "flashgate_failure_mode_decisions_total",
		"fleet size":                     "flashgate_fleet_size",
		"bans in force":                  "flashgate_bans_in_force",
		"bans raised":                    "flashgate_bans_raised_total",
		"bans lifted":                    "flashgate_bans_lifted_total",
		"config reloads":                 "flashgate_config_reloads_total",
		"ratelimit config reloads":       "flashgate_rls_config_reloads_total",
		"HTTP front-end rejects":         "flashgate_http_authz_rejected_total",
		"RLS requests":                   "flashgate_rls_requests_total",
		"RLS latency quantiles":          "flashgate_rls_request_duration_seconds_bucket",
		"local denials (no Redis asked)": "flashgate_local_denials_total",
	} {
		if _, ok := names[metric]; !ok {
			t.Errorf("no panel shows %s (%s)", what, metric)
		}
	}
}
