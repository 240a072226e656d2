package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func newVersionCmd(e env) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version and commit flashgate was built from",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			info, _ := debug.ReadBuildInfo()
			return writeVersion(e.stdout, info)
		},
	}
}

// writeVersion prints one line:
//
//	flashgate v1.2.3 commit 0123abcd (modified) 2026-01-02T03:04:05Z go1.26.0 linux/amd64
//
// A build outside a module version prints "devel"; without VCS stamping
// (-buildvcs=false, no .git) the commit is "unknown". info may be nil.
func writeVersion(w io.Writer, info *debug.BuildInfo) error {
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
	line := fmt.Sprintf("flashgate %s commit %s", version, commit)
	if modified {
		line += " (modified)"
	}
	if when != "" {
		line += " " + when
	}
	line += fmt.Sprintf(" %s %s/%s\n", goVersion, runtime.GOOS, runtime.GOARCH)
	if _, err := io.WriteString(w, line); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}
