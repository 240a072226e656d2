package main

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// jsonLines decodes the JSON log lines in s.
func jsonLines(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("not a JSON log line: %q", line)
		}
		out = append(out, rec)
	}
	return out
}

func TestLogDurationsAsStrings(t *testing.T) {
	var buf syncBuffer
	h, err := newLogHandler(&buf, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	slog.New(h).Info("durations", "retry_in", 250*time.Millisecond, slog.Group("g", "cooldown", 2*time.Second))
	r := jsonLines(t, buf.String())[0]
	if r["retry_in"] != "250ms" || r["g"].(map[string]any)["cooldown"] != "2s" {
		t.Errorf("logged %v, want durations as strings", r)
	}
}
