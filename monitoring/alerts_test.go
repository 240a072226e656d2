package monitoring

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const (
	alertsFile         = "alerts.yaml"
	alertsTestFile     = "alerts_test.yaml"
	prometheusRuleFile = "prometheusrule.yaml"
)

// ruleGroup is a group of a Prometheus rules file; unknown fields fail the
// strict decoding, so that a misspelt key (annotation, for) is caught.
type ruleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []rule `json:"rules"`
}

type rule struct {
	Alert         string            `json:"alert,omitempty"`
	Record        string            `json:"record,omitempty"`
	Expr          string            `json:"expr"`
	For           string            `json:"for,omitempty"`
	KeepFiringFor string            `json:"keep_firing_for,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

type ruleFile struct {
	Groups []ruleGroup `json:"groups"`
}

// prometheusRule is the Prometheus Operator's PrometheusRule.
type prometheusRule struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace,omitempty"`
		Labels    map[string]string `json:"labels,omitempty"`
	} `json:"metadata"`
	Spec ruleFile `json:"spec"`
}

// promtoolTests is the part of a `promtool test rules` file the tests read.
type promtoolTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		Name          string `json:"name"`
		AlertRuleTest []struct {
			EvalTime  string `json:"eval_time"`
			AlertName string `json:"alertname"`
			ExpAlerts []struct {
				ExpLabels      map[string]string `json:"exp_labels"`
				ExpAnnotations map[string]string `json:"exp_annotations"`
			} `json:"exp_alerts"`
		} `json:"alert_rule_test"`
		PromQLExprTest []struct {
			Expr string `json:"expr"`
		} `json:"promql_expr_test"`
	} `json:"tests"`
}

func decodeStrict(t *testing.T, file string, into any) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// alertRules are the rules of alerts.yaml, recording rules included.
func alertRules(t *testing.T) []rule {
	t.Helper()
	var f ruleFile
	decodeStrict(t, alertsFile, &f)
	var out []rule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	if len(out) == 0 {
		t.Fatalf("%s has no rules", alertsFile)
	}
	return out
}

// foreignMetrics are the series an alert may name that flashgate does not
// export, by who does: a test cannot ask serve for them.
var foreignMetrics = map[string]string{
	"up":                              "Prometheus, for every scrape target",
	"kube_pod_container_status_ready": "kube-state-metrics",
}

// String names r in messages.
func (r rule) String() string {
	if r.Alert != "" {
		return "alert " + r.Alert
	}
	return "recording rule " + r.Record
}

// alertMetrics parses every rule expression and returns the metrics they
// name, each with the rules that name it; a series recorded by a rule of
// the file is not a metric to export (its rule's own names are), nor one of
// foreignMetrics.
func alertMetrics(t *testing.T, rules []rule) map[string][]string {
	t.Helper()
	names := map[string][]string{}
	for _, r := range rules {
		ms, err := metricNames(r.Expr)
		if err != nil {
			t.Errorf("%s: %v", r, err)
			continue
		}
		for _, m := range ms {
			names[m] = append(names[m], r.String())
		}
	}
	for _, r := range rules {
		delete(names, r.Record)
	}
	for m := range foreignMetrics {
		delete(names, m)
	}
	return names
}

// TestAlerts checks the rules' shape: each alert with a severity and a
// runbook's summary and description, each recording rule named
// level:metric:operations and used by an alert, the PrometheusRule holding
// the same groups, and alerts_test.yaml firing each alert in one case and
// not in another and evaluating each recording rule. TestMonitoring runs
// them through promtool.
func TestAlerts(t *testing.T) {
	rules := alertRules(t)
	seen := map[string]bool{}
	records := map[string]bool{}
	for _, r := range rules {
		if r.Record != "" {
			if r.Alert != "" || strings.Count(r.Record, ":") != 2 || records[r.Record] {
				t.Errorf("recording rule %q: want one rule named level:metric:operations, not an alert too", r.Record)
			}
			records[r.Record] = true
			used := false
			for _, o := range rules {
				ms, _ := metricNames(o.Expr)
				used = used || (o.Alert != "" && slices.Contains(ms, r.Record))
			}
			if !used {
				t.Errorf("recording rule %s: no alert uses it", r.Record)
			}
			continue
		}
		if r.Alert == "" {
			t.Errorf("rule %q is neither an alert nor a recording rule", r.Expr)
			continue
		}
		if seen[r.Alert] {
			t.Errorf("alert %s defined twice", r.Alert)
		}
		seen[r.Alert] = true
		if s := r.Labels["severity"]; s != "warning" && s != "critical" {
			t.Errorf("alert %s: severity %q, want warning or critical", r.Alert, s)
		}
		for _, a := range []string{"summary", "description"} {
			if len(strings.Fields(r.Annotations[a])) < 3 {
				t.Errorf("alert %s: annotation %s %q says too little", r.Alert, a, r.Annotations[a])
			}
		}
	}
	for _, want := range []string{"FlashgateDown", "FlashgateAbsent", "FlashgateNotReady", "FlashgateRedisErrors", "FlashgateRedisSlow", "FlashgateBreakerOpen",
		"FlashgateFailureModeDecisions", "FlashgateFleetSizeDropped", "FlashgateConfigReloadFailed",
		"FlashgateRuleDeniesUnusualShare", "FlashgateOverrideInForce"} {
		if !seen[want] {
			t.Errorf("no alert %s", want)
		}
	}

	var pr prometheusRule
	decodeStrict(t, prometheusRuleFile, &pr)
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" || pr.Metadata.Name == "" {
		t.Errorf("%s: apiVersion %q kind %q name %q, want a monitoring.coreos.com/v1 PrometheusRule with a name",
			prometheusRuleFile, pr.APIVersion, pr.Kind, pr.Metadata.Name)
	}
	var f ruleFile
	decodeStrict(t, alertsFile, &f)
	if !reflect.DeepEqual(pr.Spec.Groups, f.Groups) {
		t.Errorf("%s's spec.groups differ from %s's groups: copy them over (indented under spec:)\n%s",
			prometheusRuleFile, alertsFile, groupsDiff(f.Groups, pr.Spec.Groups))
	}

	var pt promtoolTests // promtool checks the rest of the file
	data, err := os.ReadFile(alertsTestFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &pt); err != nil {
		t.Fatalf("%s: %v", alertsTestFile, err)
	}
	if !reflect.DeepEqual(pt.RuleFiles, []string{alertsFile}) {
		t.Errorf("%s: rule_files %v, want [%s]", alertsTestFile, pt.RuleFiles, alertsFile)
	}
	fires, quiet, evaluated := map[string]int{}, map[string]int{}, map[string]bool{}
	for _, tc := range pt.Tests {
		for _, et := range tc.PromQLExprTest {
			evaluated[strings.TrimSpace(et.Expr)] = true
		}
		for _, at := range tc.AlertRuleTest {
			if !seen[at.AlertName] {
				t.Errorf("%s: case %q tests alert %s, which %s does not define", alertsTestFile, tc.Name, at.AlertName, alertsFile)
			}
			if len(at.ExpAlerts) > 0 {
				fires[at.AlertName]++
			} else {
				quiet[at.AlertName]++
			}
		}
	}
	for _, r := range rules {
		if r.Record != "" {
			if !evaluated[r.Record] {
				t.Errorf("%s: no promql_expr_test evaluates recording rule %s", alertsTestFile, r.Record)
			}
			continue
		}
		if fires[r.Alert] == 0 || quiet[r.Alert] == 0 {
			t.Errorf("%s: alert %s has %d cases that fire it and %d that do not; want at least one of each",
				alertsTestFile, r.Alert, fires[r.Alert], quiet[r.Alert])
		}
	}
}

// groupsDiff names the rules that differ between want and got.
func groupsDiff(want, got []ruleGroup) string {
	index := func(gs []ruleGroup) map[string]rule {
		m := map[string]rule{}
		for _, g := range gs {
			for _, r := range g.Rules {
				m[g.Name+"/"+r.Alert+r.Record] = r
			}
		}
		return m
	}
	w, g := index(want), index(got)
	var b strings.Builder
	for k, r := range w {
		if o, ok := g[k]; !ok {
			fmt.Fprintf(&b, "  missing: %s\n", k)
		} else if !reflect.DeepEqual(r, o) {
			fmt.Fprintf(&b, "  differs: %s\n", k)
		}
	}
	for k := range g {
		if _, ok := w[k]; !ok {
			fmt.Fprintf(&b, "  extra: %s\n", k)
		}
	}
	if b.Len() == 0 {
		return "  (group names, intervals or order)"
	}
	return b.String()
}

// promtool runs `promtool args...` in this directory and fails t with its
// output when it fails (the test goes on), or stops it with how to install
// promtool when it is missing.
func promtool(t *testing.T, args ...string) {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is not on PATH (%v): the alert rules are tested with it. Install it: "+
			"Debian/Ubuntu 'apt-get install prometheus' (with /usr/sbin/policy-rc.d answering 101 so that the "+
			"service does not start, as .ci/run does), or put promtool from a Prometheus release on PATH", err)
	}
	out, err := exec.Command(bin, args...).CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		t.Errorf("promtool %s failed (%v):\n%s", strings.Join(args, " "), err, out)
		return
	}
	if err != nil {
		t.Fatalf("run promtool %s: %v", strings.Join(args, " "), err)
	}
	t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
}
