package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestLine(t *testing.T) {
	vcs := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.2.3"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123abcd"}, {Key: "vcs.modified", Value: "true"}, {Key: "vcs.time", Value: "2026-01-02T03:04:05Z"},
	}}
	tests := map[string]struct {
		stamp Stamp
		info  *debug.BuildInfo
		want  string
	}{
		"no build info": {Stamp{}, nil, "flashgate devel commit unknown go"},
		"devel without vcs": {
			Stamp{}, &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}},
			"flashgate devel commit unknown go1.26.0 ",
		},
		"release with vcs": {Stamp{}, vcs, "flashgate v1.2.3 commit 0123abcd (modified) 2026-01-02T03:04:05Z go1.26.0 "},
		"stamped, no vcs": {
			Stamp{Version: "v2.0.0", Commit: "feedc0de"}, &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}},
			"flashgate v2.0.0 commit feedc0de go1.26.0 ",
		},
		"stamped wins over vcs": {Stamp{Version: "v2.0.0", Commit: "feedc0de"}, vcs, "flashgate v2.0.0 commit feedc0de (modified) "},
		"commit stamped only":   {Stamp{Commit: "feedc0de"}, nil, "flashgate devel commit feedc0de go"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := Line(tc.stamp, tc.info); !strings.HasPrefix(got, tc.want) {
				t.Errorf("got %q, want prefix %q", got, tc.want)
			}
		})
	}
}
