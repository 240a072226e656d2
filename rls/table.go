package rls

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/flashgate/flashgate/enforce"
)

// WriteTable prints c's domains and rules for people (`flashgate
// validate`), one table per domain; it returns the first write error.
func (c *Config) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, d := range c.Domains() {
		fmt.Fprintf(tw, "domain %s (%s)\n", d.Name, d.File)
		fmt.Fprintln(tw, "  rule\tlimit\twindow\toptions")
		for _, r := range d.Rules() {
			limit, win := "unlimited", ""
			if !r.Unlimited {
				limit, win = fmt.Sprint(r.RequestsPerUnit), r.Window.String()
			}
			var opts []string
			if r.Name != "" {
				opts = append(opts, "path="+r.Path)
			}
			if r.Buckets > 0 {
				b := fmt.Sprintf("buckets=%d", r.Buckets)
				if r.AutoBuckets {
					b += " (auto)"
				}
				opts = append(opts, b)
			}
			if r.Shadow {
				opts = append(opts, "shadow")
			}
			if r.QuotaMode {
				opts = append(opts, "quota_mode (enforced as a limit)")
			}
			for _, rep := range r.Replaces {
				opts = append(opts, "replaces="+rep)
			}
			if r.FailureMode != enforce.FailureDefault {
				opts = append(opts, "failure_mode="+r.FailureMode.String())
			}
			if r.LocalShare > 0 {
				opts = append(opts, fmt.Sprintf("local_share=%d", r.LocalShare))
			}
			switch {
			case r.Ban == nil:
			case r.Ban.Enabled():
				opts = append(opts, fmt.Sprintf("ban=%d/%s:%s", r.Ban.Threshold, r.Ban.Window, r.Ban.Duration))
			default:
				opts = append(opts, "ban=off")
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", r.Label(), limit, win, strings.Join(opts, " "))
		}
	}
	return tw.Flush()
}
