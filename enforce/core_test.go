package enforce_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/enforce/enforcetest"
	"github.com/flashgate/flashgate/window"
)

// limiter answers d, or fails with err; it records how often it was asked.
type limiter struct {
	d     window.Decision
	err   error
	calls int
}

func (l *limiter) Decide(_ context.Context, hits []window.Hit) (window.Decision, error) {
	l.calls++
	return l.d, l.err
}

// fallback records the hits it was given and answers d, or fails with err.
type fallback struct {
	d     window.Decision
	err   error
	got   []string // rules of the hits it decided
	cause error
	live  bool // the context was still live
}

func (f *fallback) DecideAfter(ctx context.Context, hits []window.Hit, cause error) (window.Decision, error) {
	f.got, f.cause, f.live = nil, cause, ctx.Err() == nil
	for _, h := range hits {
		f.got = append(f.got, h.Rule)
	}
	return f.d, f.err
}

// modes are the Policies of a test's hits.
type modes []enforce.FailureMode

func (m modes) FailureMode(i int) enforce.FailureMode { return m[i] }

func hits(shadow ...bool) []window.Hit {
	hs := make([]window.Hit, len(shadow))
	for i, s := range shadow {
		hs[i] = window.Hit{Key: fmt.Sprint("k", i), Rule: fmt.Sprint("r", i), Limit: window.Limit{Requests: 1, Window: time.Second}, Shadow: s}
	}
	return hs
}

func newFront(t *testing.T, opts enforce.Options, fe enforce.FrontEnd) (*enforce.Front, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	c, err := enforce.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.Front(fe)
	if err != nil {
		t.Fatal(err)
	}
	return f, reg
}

// extAuthz and rlsFront are two front-ends' families, as extauthz and rls
// register them.
var (
	extAuthz = enforce.FrontEnd{Name: "ext_authz", Metrics: enforce.MetricNames{
		Requests:        prometheus.Opts{Name: "flashgate_checks_total", Help: "h"},
		Duration:        prometheus.Opts{Name: "flashgate_check_duration_seconds", Help: "h"},
		Reloads:         prometheus.Opts{Name: "flashgate_config_reloads_total", Help: "h"},
		BackendErrors:   prometheus.Opts{Name: "flashgate_backend_errors_total", Help: "h"},
		FailureModes:    prometheus.Opts{Name: "flashgate_failure_mode_decisions_total", Help: "h"},
		LocalDenials:    prometheus.Opts{Name: "flashgate_local_denials_total", Help: "h"},
		BackendDuration: prometheus.Opts{Name: "flashgate_redis_duration_seconds", Help: "h"},
	}}
	rlsFront = enforce.FrontEnd{Name: "rls", KeyNamespace: "rls.", Metrics: enforce.MetricNames{
		Requests:      prometheus.Opts{Name: "flashgate_rls_requests_total", Help: "h"},
		Duration:      prometheus.Opts{Name: "flashgate_rls_request_duration_seconds", Help: "h"},
		Reloads:       prometheus.Opts{Name: "flashgate_rls_config_reloads_total", Help: "h"},
		BackendErrors: prometheus.Opts{Name: "flashgate_rls_backend_errors_total", Help: "h"},
		FailureModes:  prometheus.Opts{Name: "flashgate_rls_failure_mode_decisions_total", Help: "h"},
		LocalDenials:  prometheus.Opts{Name: "flashgate_rls_local_denials_total", Help: "h"},
	}}
)

var errDown = fmt.Errorf("redis decide: %w", context.DeadlineExceeded)

// TestDecideFailureModes: when the limiter fails, deny wins if an enforcing
// hit's mode is deny; else the hits of mode local go to the fallback (only
// they, their indices mapped back); else allow. Each path is counted.
func TestDecideFailureModes(t *testing.T) {
	local := enforce.FailureLocal
	allow := enforce.FailureAllow
	deny := enforce.FailureDeny
	def := enforce.FailureDefault
	fbDenies := window.Decision{Allowed: false, Index: 1, RetryAfter: time.Second, ShadowIndex: -1}
	tests := map[string]struct {
		shadow      []bool
		modes       modes
		defaultMode enforce.FailureMode
		noFallback  bool
		fallbackErr error

		via        enforce.Via
		denier     int      // ViaDeny
		shadowDeny bool     //
		fellBack   []string // the rules the fallback decided
		hit        int      // Outcome.Hit(Decision.Index), ViaFallback
		counted    string   // failure_mode label
	}{
		"deny refuses":              {shadow: []bool{false, false}, modes: modes{local, deny}, via: enforce.ViaDeny, denier: 1, counted: "deny"},
		"first enforcing deny":      {shadow: []bool{true, false, false}, modes: modes{deny, deny, deny}, via: enforce.ViaDeny, denier: 1, shadowDeny: true, counted: "deny"},
		"shadow deny only marks":    {shadow: []bool{true, false}, modes: modes{deny, allow}, via: enforce.ViaAllow, shadowDeny: true, counted: "allow"},
		"all local: every hit":      {shadow: []bool{false, false}, modes: modes{local, local}, via: enforce.ViaFallback, fellBack: []string{"r0", "r1"}, hit: 1, counted: "local"},
		"local subset, mapped back": {shadow: []bool{false, false, false}, modes: modes{allow, local, local}, via: enforce.ViaFallback, fellBack: []string{"r1", "r2"}, hit: 2, counted: "local"},
		"allow admits":              {shadow: []bool{false}, modes: modes{allow}, via: enforce.ViaAllow, counted: "allow"},
		"default is the core's":     {shadow: []bool{false}, modes: modes{def}, defaultMode: deny, via: enforce.ViaDeny, denier: 0, counted: "deny"},
		"default defaults to local": {shadow: []bool{false, false}, modes: modes{def, def}, via: enforce.ViaFallback, fellBack: []string{"r0", "r1"}, hit: 1, counted: "local"},
		"local without fallback":    {shadow: []bool{false}, modes: modes{local}, noFallback: true, via: enforce.ViaAllow, counted: "allow"},
		"fallback fails: allow":     {shadow: []bool{false, false}, modes: modes{local, local}, fallbackErr: errors.New("full"), via: enforce.ViaAllow, fellBack: []string{"r0", "r1"}, counted: "allow"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			fb := &fallback{d: fbDenies, err: tc.fallbackErr}
			opts := enforce.Options{Limiter: &limiter{err: errDown}, FailureMode: tc.defaultMode}
			if !tc.noFallback {
				opts.Fallback = fb
			}
			f, reg := newFront(t, opts, extAuthz)
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // the caller gave up: the fallback decides all the same
			o := f.DecideHits(ctx, hits(tc.shadow...), tc.modes)
			if o.Via != tc.via || !o.Failed() {
				t.Fatalf("via %d, want %d", o.Via, tc.via)
			}
			if o.ShadowDeny != tc.shadowDeny {
				t.Errorf("ShadowDeny %v, want %v", o.ShadowDeny, tc.shadowDeny)
			}
			if tc.via == enforce.ViaDeny && o.Denier != tc.denier {
				t.Errorf("Denier %d, want %d", o.Denier, tc.denier)
			}
			if !slices.Equal(fb.got, tc.fellBack) {
				t.Errorf("fallback decided %v, want %v", fb.got, tc.fellBack)
			}
			if fb.got != nil && (!errors.Is(fb.cause, errDown) || !fb.live) {
				t.Errorf("fallback told %v, context live %v; want the cause and a live context", fb.cause, fb.live)
			}
			if tc.via == enforce.ViaFallback {
				if o.Decision != fbDenies {
					t.Errorf("decision %+v, want the fallback's", o.Decision)
				}
				if got := o.Hit(o.Decision.Index); got != tc.hit {
					t.Errorf("Hit(%d) = %d, want %d", o.Decision.Index, got, tc.hit)
				}
			}
			for i := range tc.shadow {
				want := tc.via == enforce.ViaFallback && slices.Contains(tc.fellBack, fmt.Sprint("r", i))
				if o.Decided(i) != want {
					t.Errorf("Decided(%d) = %v, want %v", i, !want, want)
				}
			}
			if got := enforcetest.Counter(t, reg, "flashgate_failure_mode_decisions_total", tc.counted); got != 1 {
				t.Errorf("failure_mode_decisions{%s} = %v, want 1", tc.counted, got)
			}
			if got := enforcetest.Counter(t, reg, "flashgate_backend_errors_total", "timeout"); got != 1 {
				t.Errorf("backend_errors{timeout} = %v, want 1", got)
			}
			wantFbErr := 0.0
			if tc.fallbackErr != nil {
				wantFbErr = 1
			}
			if got := enforcetest.Counter(t, reg, "flashgate_backend_errors_total", "fallback"); got != wantFbErr {
				t.Errorf("backend_errors{fallback} = %v, want %v", got, wantFbErr)
			}
		})
	}
}

// TestDecideLimiter: a limiter's decision passes through untouched; a
// local denial is counted by its reason; no hits ask nothing.
func TestDecideLimiter(t *testing.T) {
	tests := map[string]struct {
		hits   int
		d      window.Decision
		reason string // local_denials label counted, "" none
	}{
		"backend admits": {hits: 2, d: window.Decision{Allowed: true, Index: 1, Remaining: 3, ShadowIndex: -1}},
		"guard full":     {hits: 1, d: window.Decision{Index: 0, RetryAfter: time.Second, ShadowIndex: -1, Source: window.SourceLocalFull}, reason: "full"},
		"guard banned":   {hits: 1, d: window.Decision{Index: 0, RetryAfter: time.Minute, ShadowIndex: -1, Source: window.SourceLocalBanned}, reason: "banned"},
		"no hits":        {hits: 0, d: window.Decision{Allowed: true, Index: -1, ShadowIndex: -1}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			lim := &limiter{d: tc.d}
			f, reg := newFront(t, enforce.Options{Limiter: lim, Fallback: &fallback{}}, extAuthz)
			hs := hits(make([]bool, tc.hits)...)
			o := f.DecideHits(context.Background(), hs, modes(make([]enforce.FailureMode, tc.hits)))
			if o.Via != enforce.ViaLimiter || o.Failed() || o.Decision != tc.d {
				t.Fatalf("outcome %+v, want the limiter's %+v", o, tc.d)
			}
			if want := min(tc.hits, 1); lim.calls != want {
				t.Errorf("limiter asked %d times, want %d", lim.calls, want)
			}
			if o.Hit(o.Decision.Index) != o.Decision.Index || (tc.hits > 0 && !o.Decided(0)) {
				t.Errorf("the limiter's indices are the hits'")
			}
			for _, r := range []string{"full", "banned"} {
				want := 0.0
				if r == tc.reason {
					want = 1
				}
				if got := enforcetest.Counter(t, reg, "flashgate_local_denials_total", r); got != want {
					t.Errorf("local_denials{%s} = %v, want %v", r, got, want)
				}
			}
		})
	}
}

// TestFrontMetrics: each front-end counts under its own names, its own
// metrics (FrontMetrics) and the core's, registered once however often its
// Front is taken; the RLS has no backend latency.
func TestFrontMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	c, err := enforce.New(enforce.Options{Limiter: &limiter{err: errDown}, FailureMode: enforce.FailureAllow, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	fronts := map[string]*enforce.Front{}
	for _, fe := range []enforce.FrontEnd{extAuthz, rlsFront, extAuthz} {
		f, err := c.Front(fe)
		if err != nil {
			t.Fatalf("%s: %v", fe.Name, err)
		}
		if g, ok := fronts[fe.Name]; ok && g != f {
			t.Errorf("%s: a second Front, want the first", fe.Name)
		}
		fronts[fe.Name] = f
	}
	fronts[rlsFront.Name].DecideHits(context.Background(), hits(false), modes{enforce.FailureDefault})
	for _, f := range fronts { // a CounterVec is gathered once it has a child
		f.Metrics().Requests.WithLabelValues("d", "r", enforce.DecisionAllowed).Inc()
	}
	for series, want := range map[[2]string]float64{
		{"flashgate_rls_failure_mode_decisions_total", "allow"}: 1,
		{"flashgate_rls_backend_errors_total", "timeout"}:       1,
		{"flashgate_failure_mode_decisions_total", "allow"}:     0,
		{"flashgate_backend_errors_total", "timeout"}:           0,
	} {
		if got := enforcetest.Counter(t, reg, series[0], series[1]); got != want {
			t.Errorf("%s{%s} = %v, want %v", series[0], series[1], got, want)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	want := []string{
		"flashgate_backend_errors_total", "flashgate_check_duration_seconds", "flashgate_checks_total",
		"flashgate_config_reloads_total", "flashgate_failure_mode_decisions_total", "flashgate_local_denials_total",
		"flashgate_redis_duration_seconds", "flashgate_rls_backend_errors_total", "flashgate_rls_config_reloads_total", "flashgate_rls_failure_mode_decisions_total", "flashgate_rls_local_denials_total",
		"flashgate_rls_request_duration_seconds", "flashgate_rls_requests_total",
	}
	if !slices.Equal(names, want) {
		t.Errorf("families %v, want %v", names, want)
	}
}

func TestNewNeedsLimiter(t *testing.T) {
	if _, err := enforce.New(enforce.Options{}); err == nil {
		t.Fatal("New without a limiter succeeded")
	}
}
