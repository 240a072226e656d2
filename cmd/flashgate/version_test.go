package main

import (
	"bytes"
	"context"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionCommand(t *testing.T) {
	out, _, err := runCmd(t, context.Background(), "version")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^flashgate \S+ commit \S+.* go\S+ \w+/\w+\n$`).MatchString(out) {
		t.Errorf("version = %q", out)
	}
}

func TestWriteVersion(t *testing.T) {
	tests := map[string]struct {
		info *debug.BuildInfo
		want string
	}{
		"no build info": {nil, "flashgate devel commit unknown go"},
		"devel without vcs": {
			&debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}},
			"flashgate devel commit unknown go1.26.0 ",
		},
		"release with vcs": {
			&debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.2.3"}, Settings: []debug.BuildSetting{
				{Key: "vcs.revision", Value: "0123abcd"}, {Key: "vcs.modified", Value: "true"}, {Key: "vcs.time", Value: "2026-01-02T03:04:05Z"},
			}},
			"flashgate v1.2.3 commit 0123abcd (modified) 2026-01-02T03:04:05Z go1.26.0 ",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var b bytes.Buffer
			if err := writeVersion(&b, tc.info); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(b.String(), tc.want) {
				t.Errorf("got %q, want prefix %q", b.String(), tc.want)
			}
		})
	}
}
