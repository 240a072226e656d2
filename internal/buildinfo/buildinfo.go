// Package buildinfo says which build a binary is: its version and commit,
// as the linker stamped them or as the module's build info records them.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Stamp is what the build stamped into the binary; empty fields were not.
type Stamp struct {
	Version, Commit string
}

// Line is flashgate version's line:
//
//	flashgate v1.2.3 commit 0123abcd (modified) 2026-01-02T03:04:05Z go1.26.0 linux/amd64
//
// A stamped version or commit wins over the build info's. Without either, a
// build outside a module version prints "devel", and one without VCS
// stamping (-buildvcs=false, no .git) the commit "unknown". info may be nil.
func Line(s Stamp, info *debug.BuildInfo) string {
	version, commit, modified, when := "devel", "unknown", false, ""
	goVersion := runtime.Version()
	if info != nil {
		if v := info.Main.Version; v != "" && v != "(devel)" {
			version = v
		}
		if info.GoVersion != "" {
			goVersion = info.GoVersion
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			case "vcs.time":
				when = s.Value
			}
		}
	}
	if s.Version != "" {
		version = s.Version
	}
	if s.Commit != "" {
		commit = s.Commit
	}
	line := fmt.Sprintf("flashgate %s commit %s", version, commit)
	if modified {
		line += " (modified)"
	}
	if when != "" {
		line += " " + when
	}
	return line + fmt.Sprintf(" %s %s/%s\n", goVersion, runtime.GOOS, runtime.GOARCH)
}
