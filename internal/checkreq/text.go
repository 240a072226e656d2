package checkreq

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
)

// Run asks count times as o says and writes each answer to w: one JSON
// object a line with asJSON, else its [Result.Text]. It fails when a call
// did.
func Run(ctx context.Context, w io.Writer, o ClientOptions, count int, asJSON bool) error {
	if count < 1 {
		return fmt.Errorf("-n %d: must be at least 1", count)
	}
	if o.Timeout <= 0 {
		return fmt.Errorf("--timeout %s: must be positive", o.Timeout)
	}
	client, err := NewClient(o)
	if err != nil {
		return err
	}
	defer client.Close()
	enc := json.NewEncoder(w)
	return client.Repeat(ctx, count, func(res Result) (err error) {
		if asJSON {
			err = enc.Encode(res)
		} else {
			_, err = io.WriteString(w, res.Text())
		}
		if err != nil {
			return fmt.Errorf("write: %w", err)
		}
		return nil
	})
}

// Text formats r for people, as one line:
//
//	#1 allowed 200 0.412ms x-ratelimit-limit: 5; x-ratelimit-remaining: 4
func (r Result) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d ", r.N)
	if r.Error != "" {
		fmt.Fprintf(&b, "error %.3fms %s\n", r.LatencyMS, r.Error)
		return b.String()
	}
	verdict := "denied"
	if r.Allowed {
		verdict = "allowed"
	}
	fmt.Fprintf(&b, "%s %d %.3fms", verdict, r.Status, r.LatencyMS)
	writeHeaders(&b, " ", r.Headers)
	if len(r.UpstreamHeaders) > 0 {
		writeHeaders(&b, " upstream: ", r.UpstreamHeaders)
	}
	if r.Body != "" {
		fmt.Fprintf(&b, " body: %s", r.Body)
	}
	for i, st := range r.Statuses {
		if i == 0 {
			b.WriteString(" descriptors:")
		}
		b.WriteByte(' ')
		b.WriteString(st.String())
	}
	if !r.Allowed && r.Code != "" && r.Code != codes.ResourceExhausted.String() && r.Code != OverLimit {
		fmt.Fprintf(&b, " (code %s)", r.Code)
	}
	b.WriteByte('\n')
	return b.String()
}

func writeHeaders(b *strings.Builder, lead string, h map[string]string) {
	for i, k := range slices.Sorted(maps.Keys(h)) {
		if i == 0 {
			b.WriteString(lead)
		} else {
			b.WriteString("; ")
		}
		b.WriteString(k + ": " + h[k])
	}
}
