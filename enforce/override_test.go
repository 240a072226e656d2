package enforce_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/memory"
	"github.com/flashgate/flashgate/window/overrides"
)

// TestDecideAppliesOverrides: Decide applies the override in force of a
// hit's rule (by its counters' label): a cut limit denies where the file's
// admits and names the override's policy; a dry run denies nothing and
// counts its would-be denials; the end of the override restores the
// file's rule.
func TestDecideAppliesOverrides(t *testing.T) {
	mem, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	clock := time.Now()
	now := func() time.Time { return clock }
	book := overrides.NewBook(now)
	f, reg := newFront(t, enforce.Options{Limiter: mem, Overrides: book}, extAuthz)
	lbl := enforce.RuleLabel{Domain: "shop", Rule: "coupon"}
	var counters *enforce.RuleCounters
	f.Series().Install([]enforce.RuleLabel{lbl}, true, func(m map[enforce.RuleLabel]*enforce.RuleCounters) { counters = m[lbl] })
	file := window.Limit{Requests: 100, Window: time.Minute}
	policy := enforce.NewPolicy("coupon", file)
	n := 0
	// Three requests of one fresh key; the third's verdict.
	third := func() enforce.Verdict {
		var r enforce.Request
		key := "key" + time.Duration(n).String()
		n++
		var v enforce.Verdict
		for range 3 {
			r.Reset()
			r.Hits = append(r.Hits, window.Hit{Key: key, Rule: "coupon", Limit: file})
			r.Tags = append(r.Tags, enforce.HitTag{Policy: policy, Counters: counters})
			r.Hits[0].Tag = &r.Tags[0]
			v = f.Decide(context.Background(), &r)
		}
		return v
	}
	if v := third(); v.Denied() {
		t.Fatal("denied without an override")
	}
	cut := &overrides.Override{Target: overrides.Target{Domain: "shop", Rule: "coupon"}, Mode: overrides.ModeLimit, Requests: 2,
		Set: clock, Until: clock.Add(time.Minute)}
	book.Replace([]*overrides.Override{cut})
	v := third()
	if !v.Denied() || v.Answer.Policies[0].Quota() != 2 || v.Answer.Policies[0].Ref != -1 {
		t.Fatalf("under a cut to 2: denied %v, policy %+v", v.Denied(), v.Answer.Policies)
	}

	dry := &overrides.Override{Target: cut.Target, Mode: overrides.ModeDryRun, Requests: 2, Set: clock, Until: clock.Add(time.Minute)}
	book.Replace([]*overrides.Override{dry})
	if v := third(); v.Denied() || v.Answer.Shadow || v.Answer.Policies[0] != policy {
		t.Fatalf("a dry run: denied %v, shadow %v, policies %v; want the file's answer", v.Denied(), v.Answer.Shadow, v.Answer.Policies)
	}
	if got := dryRuns(t, reg, "would_deny"); got != 1 {
		t.Fatalf("would-be denials counted: %v, want 1", got)
	}

	// A raise without allow_raise (written to Redis by hand, or the file
	// came below it): the file's limit stands, and the Book hears of it
	// once, however many checks meet it.
	var skipped []overrides.Skip
	book.OnSkip(func(s overrides.Skip) { skipped = append(skipped, s) })
	raise := &overrides.Override{Target: cut.Target, Mode: overrides.ModeLimit, Requests: 1000, Set: clock, Until: clock.Add(time.Minute)}
	book.Replace([]*overrides.Override{raise})
	for range 2 {
		if v := third(); v.Denied() || v.Answer.Policies[0] != policy {
			t.Fatalf("a raise without allow_raise: denied %v, policies %v; want the file's answer", v.Denied(), v.Answer.Policies)
		}
	}
	if len(skipped) != 1 || skipped[0].Reason != overrides.SkipRaise {
		t.Fatalf("skips reported: %+v, want one raise", skipped)
	}

	book.Replace([]*overrides.Override{cut})
	clock = clock.Add(time.Minute) // its end
	if v := third(); v.Denied() {
		t.Fatal("denied after the override's end")
	}
}

// dryRuns is flashgate_override_dry_run_total{domain="shop",rule="coupon",result}.
func dryRuns(t *testing.T, g prometheus.Gatherer, result string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "flashgate_override_dry_run_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if got["domain"] == "shop" && got["rule"] == "coupon" && got["result"] == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// BenchmarkDecideOverrides is one check of one hit on the memory limiter:
// without overrides, with an empty book (the Redis backend's usual case),
// and with an override in force on the hit's rule.
func BenchmarkDecideOverrides(b *testing.B) {
	now := time.Now()
	lbl := enforce.RuleLabel{Domain: "shop", Rule: "coupon"}
	file := window.Limit{Requests: 1_000_000, Window: time.Minute}
	policy := enforce.NewPolicy("coupon", file)
	cut := &overrides.Override{Target: overrides.Target{Domain: "shop", Rule: "coupon"}, Mode: overrides.ModeLimit, Requests: 500_000,
		Set: now, Until: now.Add(time.Hour)}
	for _, bc := range []struct {
		name string
		book func() *overrides.Book
	}{
		{"none", func() *overrides.Book { return nil }},
		{"empty", func() *overrides.Book { return overrides.NewBook(nil) }},
		{"in-force", func() *overrides.Book {
			bk := overrides.NewBook(nil)
			bk.Replace([]*overrides.Override{cut})
			return bk
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			mem, err := memory.New(memory.Options{})
			if err != nil {
				b.Fatal(err)
			}
			opts := enforce.Options{Limiter: mem, Registerer: prometheus.NewRegistry()}
			if bk := bc.book(); bk != nil {
				opts.Overrides = bk
			}
			c, err := enforce.New(opts)
			if err != nil {
				b.Fatal(err)
			}
			f, err := c.Front(extAuthz)
			if err != nil {
				b.Fatal(err)
			}
			var counters *enforce.RuleCounters
			f.Series().Install([]enforce.RuleLabel{lbl}, true, func(m map[enforce.RuleLabel]*enforce.RuleCounters) { counters = m[lbl] })
			var r enforce.Request
			b.ReportAllocs()
			for b.Loop() {
				r.Reset()
				r.Hits = append(r.Hits, window.Hit{Key: "k", Rule: "coupon", Limit: file})
				r.Tags = append(r.Tags, enforce.HitTag{Policy: policy, Counters: counters})
				r.Hits[0].Tag = &r.Tags[0]
				f.Decide(context.Background(), &r)
			}
		})
	}
}
