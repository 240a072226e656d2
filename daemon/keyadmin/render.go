package keyadmin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/overrides"
)

// Table is a result the operator commands print: its JSON form with
// --json, else the aligned table WriteTable writes, times shown from now.
type Table interface {
	WriteTable(w io.Writer, now time.Time) error
}

// WriteJSON writes v as one indented JSON document.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

// writeAligned writes lines, their tab-separated cells aligned in columns.
func writeAligned(w io.Writer, lines ...string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, l := range lines {
		fmt.Fprintln(tw, l)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

// writeList writes rows under header, or the line none when there are none.
func writeList(w io.Writer, none, header string, rows []string) error {
	if len(rows) == 0 {
		return writeAligned(w, none)
	}
	return writeAligned(w, append([]string{header}, rows...)...)
}

// cells joins a row's cells with tabs.
func cells(c ...string) string { return strings.Join(c, "\t") }

const stampFormat = "2006-01-02T15:04:05.000Z"

// Stamp writes t for a table: UTC to the millisecond, and how far from now.
func Stamp(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := roundFor(t.Sub(now))
	rel := "now"
	switch {
	case d > 0:
		rel = "in " + d.String()
	case d < 0:
		rel = (-d).String() + " ago"
	}
	return t.UTC().Format(stampFormat) + " (" + rel + ")"
}

// roundFor rounds d for people: to the second from a minute up, else to
// the millisecond.
func roundFor(d time.Duration) time.Duration {
	if d >= time.Minute || d <= -time.Minute {
		return d.Round(time.Second)
	}
	return d.Round(time.Millisecond)
}

func remaining(ms int64) string { return roundFor(time.Duration(ms) * time.Millisecond).String() }

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// DescribeLimit writes a limit for people: "5 per 1s", bucketed or not.
func DescribeLimit(l window.Limit) string {
	s := fmt.Sprintf("%d per %s", l.Requests, l.Window)
	if l.Buckets > 0 {
		s += fmt.Sprintf(" (%d buckets)", l.Buckets)
	}
	return s
}

// DescribeBan writes a penalty box for people.
func DescribeBan(b window.Ban) string {
	if !b.Enabled() {
		return "off"
	}
	return fmt.Sprintf("%d denials in %s → %s", b.Threshold, b.Window, b.Duration)
}

// describe is o's override column, with --allow-raise shown.
func describe(o *overrides.Override) string {
	s := o.Describe()
	if o.AllowRaise {
		s += " (raise allowed)"
	}
	return s
}

// DescribeOverride is inspect's override line: "none" for nil.
func DescribeOverride(o *overrides.Override, now time.Time) string {
	if o == nil {
		return "none"
	}
	s := describe(o) + ", until " + Stamp(o.Until, now) + ", by " + dash(o.By)
	if o.Reason != "" {
		s += ": " + o.Reason
	}
	return s
}

// label is the rule column of a table.
func (n KeyNames) label() string {
	if n.Domain != "" {
		return "domain " + n.Domain
	}
	return n.Rule
}

// BanList is the bans in force, as bans list prints them.
type BanList struct {
	Bans []Ban `json:"bans"`
}

// WriteTable writes the bans, one a row.
func (l BanList) WriteTable(w io.Writer, _ time.Time) error {
	rows := make([]string, len(l.Bans))
	for i, b := range l.Bans {
		rows[i] = cells(b.label(), b.Key, remaining(b.RemainingMS), b.Until.UTC().Format(stampFormat), dash(b.Value))
	}
	return writeList(w, "no bans", cells("rule", "key", "remaining", "until", "value"), rows)
}

// WriteTable writes b as a table of one row.
func (b Ban) WriteTable(w io.Writer, now time.Time) error {
	return BanList{[]Ban{b}}.WriteTable(w, now)
}

// WriteTable writes what the lift did.
func (l Lift) WriteTable(w io.Writer, now time.Time) error {
	lines := []string{cells("rule", l.label()), cells("key", l.Key), cells("lifted", "nothing: the key was not banned")}
	if l.WasBanned {
		lines[2] = cells("lifted", "yes: the ban that would have ended "+Stamp(l.WasUntil, now)+" is over")
	}
	if l.ResetWindow {
		lines = append(lines, cells("window", "emptied"))
	}
	return writeAligned(w, lines...)
}

// OverrideRow is one override in force, as the limits commands print it.
type OverrideRow struct {
	*overrides.Override
	RemainingMS int64 `json:"remaining_ms"`
}

// OverrideList is the overrides in force, as limits list prints them.
type OverrideList struct {
	Overrides []OverrideRow `json:"overrides"`
}

func newOverrideList(list []*overrides.Override, now time.Time) OverrideList {
	out := OverrideList{Overrides: make([]OverrideRow, len(list))}
	for i, o := range list {
		out.Overrides[i] = OverrideRow{Override: o, RemainingMS: o.Until.Sub(now).Milliseconds()}
	}
	return out
}

// WriteTable writes the overrides, one a row.
func (l OverrideList) WriteTable(w io.Writer, _ time.Time) error {
	rows := make([]string, len(l.Overrides))
	for i, o := range l.Overrides {
		rows[i] = cells(dash(o.Domain), o.Rule, describe(o.Override), remaining(o.RemainingMS),
			o.Until.UTC().Format(stampFormat), dash(o.By), dash(o.Reason))
	}
	return writeList(w, "no overrides", cells("domain", "rule", "override", "remaining", "until", "by", "reason"), rows)
}

// WriteTable writes r as a table of one row.
func (r OverrideRow) WriteTable(w io.Writer, now time.Time) error {
	return OverrideList{[]OverrideRow{r}}.WriteTable(w, now)
}

// Cleared is what clearing a rule's override did.
type Cleared struct {
	overrides.Target
	// Was is the override that was in force, nil if none.
	Was *overrides.Override `json:"was,omitempty"`
}

// WriteTable writes the rule and the override cleared.
func (c Cleared) WriteTable(w io.Writer, now time.Time) error {
	was := "nothing: the rule had no override in force"
	if c.Was != nil {
		was = describe(c.Was) + ", which would have ended " + Stamp(c.Was.Until, now)
	}
	return writeAligned(w, cells("domain", dash(c.Domain)), cells("rule", c.Rule), cells("cleared", was))
}

// History is the last sets and clears of overrides, newest first.
type History struct {
	History []overrides.Event `json:"history"`
}

// WriteTable writes the events, one a row.
func (h History) WriteTable(w io.Writer, _ time.Time) error {
	rows := make([]string, len(h.History))
	for i, ev := range h.History {
		o := ev.Override
		what, span := "-", "-"
		if ev.Op == "set" {
			what, span = describe(o), roundFor(o.Until.Sub(o.Set)).String()
		}
		rows[i] = cells(ev.At.UTC().Format(stampFormat), ev.Op, dash(ev.By), dash(o.Domain), o.Rule, what, span, dash(ev.Reason))
	}
	return writeList(w, "no history", cells("at", "op", "by", "domain", "rule", "override", "for", "reason"), rows)
}

// Report is what inspect prints: the key's window, ban and held slots, and
// its rule's override in force (nil if none).
type Report struct {
	Inspection
	Override *overrides.Override `json:"override,omitempty"`
}

// Report inspects the key ref names and reads its rule's override.
func (a *Admin) Report(ctx context.Context, ref Ref) (Report, error) {
	in, err := a.Inspect(ctx, ref)
	if err != nil {
		return Report{}, err
	}
	o, err := a.Override(ctx, in.Target)
	return Report{Inspection: in, Override: o}, err
}

// WriteTable writes r with times from Redis's reading, not now.
func (r Report) WriteTable(w io.Writer, _ time.Time) error {
	rule := r.Rule
	if r.Domain != "" {
		rule = fmt.Sprintf("%s (domain %s)", r.Rule, r.Domain)
	}
	if r.Shadow {
		rule += " (shadow: never denies)"
	}
	admits := "now"
	if r.Full {
		admits = Stamp(r.AdmitsAt, r.Now)
	}
	banned := "no"
	if r.Banned {
		banned = "until " + Stamp(r.BannedUntil, r.Now)
	}
	lines := []string{
		cells("rule", rule),
		cells("key", r.Key),
		cells("count", fmt.Sprintf("%d of %s", r.Count, DescribeLimit(r.Target.Limit))),
		cells("oldest", Stamp(r.Oldest, r.Now)),
		cells("newest", Stamp(r.Newest, r.Now)),
		cells("admits", admits),
		cells("banned", banned),
		cells("penalty box", DescribeBan(r.Target.Ban)),
		cells("override", DescribeOverride(r.Override, r.Now)),
	}
	for _, h := range r.Held {
		ends := make([]string, len(h.Ends))
		for i, e := range h.Ends {
			ends[i] = Stamp(e, r.Now)
		}
		lines = append(lines, cells("held", fmt.Sprintf("%d slots by sidecar %s, leases end %s", h.Slots, h.Sidecar, strings.Join(ends, ", "))))
	}
	return writeAligned(w, lines...)
}
