package daemon

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// NewLogHandler returns the slog handler of serve's --log-level and
// --log-format for w ([New] limits its warnings and errors). Durations
// are written as strings ("250ms"), in JSON too.
func NewLogHandler(w io.Writer, level, format string) (slog.Handler, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: durationString}
	var h slog.Handler
	switch strings.ToLower(format) {
	case "json":
		h = slog.NewJSONHandler(w, opts)
	case "text":
		h = slog.NewTextHandler(w, opts)
	default:
		return nil, fmt.Errorf("--log-format %q: want json or text", format)
	}
	return h, nil
}

// durationString writes a time.Duration attribute as its string.
func durationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}
