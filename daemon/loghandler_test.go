package daemon

import (
	"log/slog"
	"testing"
	"time"

	"github.com/flashgate/flashgate/internal/testing/logtest"
)

func TestLogDurationsAsStrings(t *testing.T) {
	var buf logtest.Buffer
	h, err := NewLogHandler(&buf, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	slog.New(h).Info("durations", "retry_in", 250*time.Millisecond, slog.Group("g", "cooldown", 2*time.Second))
	r := logtest.JSONLines(t, buf.String())[0]
	if r["retry_in"] != "250ms" || r["g"].(map[string]any)["cooldown"] != "2s" {
		t.Errorf("logged %v, want durations as strings", r)
	}
}
