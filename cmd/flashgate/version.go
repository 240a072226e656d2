package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// stampedVersion and stampedCommit are set at build time by the linker, the
// only way to stamp a binary built without its .git (the image's build):
//
//	go build -ldflags "-X main.stampedVersion=v1.2.3 -X main.stampedCommit=0123abcd" ./cmd/flashgate
//
// The Dockerfile and `make build` pass them. Left empty, version reads the
// module's build info instead. Nothing assigns them at run time.
var (
	stampedVersion string
	stampedCommit  string
)

// buildStamp is what the build stamped into the binary; empty fields were not.
type buildStamp struct {
	version, commit string
}

func newVersionCmd(e env) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version and commit flashgate was built from",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			info, _ := debug.ReadBuildInfo()
			return writeVersion(e.stdout, buildStamp{version: stampedVersion, commit: stampedCommit}, info)
		},
	}
}

// writeVersion prints one line:
//
//	flashgate v1.2.3 commit 0123abcd (modified) 2026-01-02T03:04:05Z go1.26.0 linux/amd64
//
// A stamped version or commit wins over the build info's. Without either, a
// build outside a module version prints "devel", and one without VCS
// stamping (-buildvcs=false, no .git) the commit "unknown". info may be nil.
func writeVersion(w io.Writer, s buildStamp, info *debug.BuildInfo) error {
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
	if s.version != "" {
		version = s.version
	}
	if s.commit != "" {
		commit = s.commit
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
