package monitoring

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// grafanaVars are the values the dashboard's variables take for parsing:
// Grafana's built-in intervals and this dashboard's own variables. A query
// naming any other variable fails the test.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "5m",
	"$__interval", "1m",
	"$__range", "1h",
	"$job", ".*",
	"$instance", ".*",
)

// expand replaces the Grafana variables of a dashboard query so that
// PromQL can parse it, and fails on a variable it does not know.
func expand(q string) (string, error) {
	out := grafanaVars.Replace(q)
	if i := strings.Index(out, "$"); i >= 0 {
		return "", fmt.Errorf("unknown Grafana variable at %q", out[i:])
	}
	return out, nil
}

// metricNames parses expr with Prometheus's PromQL parser and returns the
// metric names it selects, sorted and unique. A selector without a metric
// name (only labels, or a __name__ regexp) is an error: its metrics could
// not be checked against what flashgate exports.
func metricNames(expr string) ([]string, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, fmt.Errorf("parse %q: %w", expr, err)
	}
	var names []string
	var bad error
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if name == "" && m.Name == labels.MetricName && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		if name == "" {
			bad = fmt.Errorf("selector %s in %q names no metric", vs, expr)
			return nil
		}
		names = append(names, name)
		return nil
	})
	if bad != nil {
		return nil, bad
	}
	sort.Strings(names)
	return slices.Compact(names), nil
}

// labelValues matches a Grafana variable query label_values(SELECTOR, LABEL).
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

// variableMetrics returns the metrics a Grafana label_values variable query
// selects.
func variableMetrics(q string) ([]string, error) {
	m := labelValues.FindStringSubmatch(strings.TrimSpace(q))
	if m == nil {
		return nil, fmt.Errorf("variable query %q is not label_values(SELECTOR, LABEL)", q)
	}
	sel, err := expand(m[1])
	if err != nil {
		return nil, err
	}
	return metricNames(sel)
}

// requireExported fails t for each metric of names (by where it is named)
// that no serve process exported (series: exported series names).
func requireExported(t *testing.T, file string, names map[string][]string, series map[string]string) {
	t.Helper()
	if len(names) == 0 {
		t.Fatalf("%s names no metric", file)
	}
	var missing []string
	for name, where := range names {
		if _, ok := series[name]; !ok {
			missing = append(missing, fmt.Sprintf("%s (in %s)", name, strings.Join(where, "; ")))
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		var have []string
		for n := range series {
			if strings.HasPrefix(n, "flashgate_") {
				have = append(have, n)
			}
		}
		sort.Strings(have)
		t.Errorf("%s names metrics that flashgate serve (memory and Redis, driven through checks, reloads, bans and a Redis outage) did not export:\n  %s\nexported: %s",
			file, strings.Join(missing, "\n  "), strings.Join(have, " "))
	}
}

func TestMetricNames(t *testing.T) {
	for name, tc := range map[string]struct {
		expr    string
		want    []string
		wantErr string
	}{
		"histogram quantile": {
			expr: `histogram_quantile(0.99, sum by (le) (rate(flashgate_check_duration_seconds_bucket{job=~".*"}[5m])))`,
			want: []string{"flashgate_check_duration_seconds_bucket"},
		},
		"binary with grouping, deduplicated": {
			expr: `sum by (rule) (rate(a_total{d="x"}[5m])) / ignoring (rule) group_left sum(rate(a_total[5m])) > on() vector(1) * scalar(b)`,
			want: []string{"a_total", "b"},
		},
		"name matcher counts as a name": {expr: `{__name__="up", job="x"}`, want: []string{"up"}},
		"subquery and offset":           {expr: `max_over_time(rate(c_total[1m])[1h:5m] offset 1d)`, want: []string{"c_total"}},
		"no metric name":                {expr: `sum(rate({job="x"}[5m]))`, wantErr: "names no metric"},
		"syntax error":                  {expr: `sum(rate(x[5m])`, wantErr: "parse"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := metricNames(tc.expr)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("metricNames(%q) = %v, %v; want an error with %q", tc.expr, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("metricNames(%q) = %v, %v; want %v", tc.expr, got, err, tc.want)
			}
		})
	}
}

func TestExpand(t *testing.T) {
	got, err := expand(`rate(x{job=~"$job", instance=~"$instance"}[$__rate_interval])`)
	if want := `rate(x{job=~".*", instance=~".*"}[5m])`; err != nil || got != want {
		t.Fatalf("expand = %q, %v; want %q", got, err, want)
	}
	if _, err := expand(`rate(x{pod=~"$pod"}[5m])`); err == nil || !strings.Contains(err.Error(), "$pod") {
		t.Fatalf("expand of an unknown variable: %v, want an error naming $pod", err)
	}
	names, err := variableMetrics(`label_values(flashgate_checks_total{job=~"$job"}, instance)`)
	if err != nil || !slices.Equal(names, []string{"flashgate_checks_total"}) {
		t.Fatalf("variableMetrics = %v, %v", names, err)
	}
	if _, err := variableMetrics(`query_result(up)`); err == nil {
		t.Fatal("variableMetrics accepted a query that is not label_values")
	}
}

// outputLabels returns the labels the series of expr carry when its
// aggregations fix them (sum by (…), histogram_quantile of one, a binary
// operation keeping its left side's), and false when they are not known
// from the expression alone (a bare selector keeps whatever was scraped).
func outputLabels(e parser.Expr) ([]string, bool) {
	switch n := e.(type) {
	case *parser.ParenExpr:
		return outputLabels(n.Expr)
	case *parser.AggregateExpr:
		if n.Without {
			return nil, false
		}
		return n.Grouping, true
	case *parser.Call:
		if n.Func.Name == "histogram_quantile" && len(n.Args) == 2 {
			ls, ok := outputLabels(n.Args[1])
			return slices.DeleteFunc(slices.Clone(ls), func(l string) bool { return l == "le" }), ok
		}
		return nil, false
	case *parser.BinaryExpr:
		if n.VectorMatching != nil && n.VectorMatching.Card == parser.CardOneToMany {
			return outputLabels(n.RHS)
		}
		if n.LHS.Type() == parser.ValueTypeScalar {
			return outputLabels(n.RHS)
		}
		return outputLabels(n.LHS)
	}
	return nil, false
}

// legendLabel matches a {{label}} of a Grafana legend.
var legendLabel = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

// legendLabelsKept fails for a {{label}} of legend that expr's series do
// not carry, when the expression fixes their labels.
func legendLabelsKept(expr, legend string) error {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return fmt.Errorf("parse %q: %w", expr, err)
	}
	kept, known := outputLabels(e)
	if !known {
		return nil
	}
	for _, m := range legendLabel.FindAllStringSubmatch(legend, -1) {
		if !slices.Contains(kept, m[1]) {
			return fmt.Errorf("legend %q shows {{%s}}, but the series keep only %v", legend, m[1], kept)
		}
	}
	return nil
}

func TestLegendLabelsKept(t *testing.T) {
	for name, tc := range map[string]struct {
		expr, legend string
		ok           bool
	}{
		"sum by":                {`sum by (rule, decision) (rate(x[5m]))`, "{{rule}} {{decision}}", true},
		"dropped by sum":        {`sum by (rule) (rate(x[5m]))`, "{{instance}}", false},
		"quantile drops le":     {`histogram_quantile(0.9, sum by (le, job) (rate(x_bucket[5m])))`, "{{job}}", true},
		"quantile keeps no le":  {`histogram_quantile(0.9, sum by (le) (rate(x_bucket[5m])))`, "{{le}}", false},
		"left side of a ratio":  {`sum by (rule) (rate(a[5m])) / scalar(sum(rate(a[5m])))`, "{{rule}}", true},
		"comparison":            {`sum by (kind) (rate(a[5m])) > 0`, "{{kind}}", true},
		"group_left keeps left": {`sum by (job, mode) (a) / ignoring (mode) group_left sum by (job) (b)`, "{{mode}}", true},
		"bare selector unknown": {`flashgate_fleet_size{job="x"}`, "{{instance}}", true},
		"without unknown":       {`sum without (le) (a)`, "{{anything}}", true},
	} {
		t.Run(name, func(t *testing.T) {
			err := legendLabelsKept(tc.expr, tc.legend)
			if (err == nil) != tc.ok {
				t.Fatalf("legendLabelsKept(%q, %q) = %v, want ok %v", tc.expr, tc.legend, err, tc.ok)
			}
		})
	}
}
