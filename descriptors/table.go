package descriptors

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/window"
)

// WriteTable prints c's rules for people (`flashgate validate`); it
// returns the first write error.
func (c *Config) WriteTable(w io.Writer) error {
	ip := "source address"
	if c.ClientIP.TrustedHops > 0 {
		ip = fmt.Sprintf("x-forwarded-for, %d trusted hop(s)", c.ClientIP.TrustedHops)
	}
	paths := ""
	if c.PathCase == PathCaseInsensitive {
		paths = ", paths case-insensitive"
	}
	if _, err := fmt.Fprintf(w, "domain %s (%s), client IP: %s%s\n", c.Domain, c.Name, ip, paths); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tREQUESTS\tLIMIT KEY\tLIMIT\tOPTIONS")
	for _, r := range c.Rules {
		var when, per, opts []string
		for _, m := range r.Match {
			switch {
			case m.HasValue && m.Prefix:
				when = append(when, fmt.Sprintf("%s starting %q", m.Source, m.Value))
			case m.HasValue:
				when = append(when, fmt.Sprintf("%s = %q", m.Source, m.Value))
			default:
				per = append(per, m.Source.String())
			}
		}
		if len(when) == 0 {
			when = []string{"every request"}
		}
		if len(per) == 0 {
			per = []string{"(one shared bucket)"}
		}
		if r.Limit.Buckets > 0 {
			b := fmt.Sprintf("buckets=%d", r.Limit.Buckets)
			if r.AutoBuckets {
				b += " (auto)"
			}
			opts = append(opts, b)
		}
		if r.Shadow {
			opts = append(opts, "shadow")
		}
		if r.FailureMode != enforce.FailureDefault {
			opts = append(opts, "failure_mode="+r.FailureMode.String())
		}
		if r.LocalShare > 0 {
			opts = append(opts, fmt.Sprintf("local_share=%d", r.LocalShare))
		}
		if r.OnMissing == MissingDeny {
			opts = append(opts, "on_missing=deny")
		}
		if r.Ban != nil {
			opts = append(opts, "ban="+banText(*r.Ban))
		}
		if r.Lease > 0 {
			opts = append(opts, "lease="+r.Lease.String())
		}
		if len(opts) == 0 {
			opts = []string{"-"}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%s\t%s\n", r.Name, strings.Join(when, " and "),
			strings.Join(per, " + "), r.Limit.Requests, r.Limit.Window, strings.Join(opts, " "))
	}
	return tw.Flush()
}

// banText writes a rule's penalty box as the file does, "{}" for the
// server's.
func banText(b window.Ban) string {
	var f []string
	if b.Threshold > 0 {
		f = append(f, fmt.Sprintf("threshold: %d", b.Threshold))
	}
	if b.Window > 0 {
		f = append(f, "window: "+b.Window.String())
	}
	if b.Duration > 0 {
		f = append(f, "duration: "+b.Duration.String())
	}
	return "{" + strings.Join(f, ", ") + "}"
}
