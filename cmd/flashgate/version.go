package main

import (
	"fmt"
	"io"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/flashgate/flashgate/internal/buildinfo"
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

func newVersionCmd(e env) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version and commit flashgate was built from",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			info, _ := debug.ReadBuildInfo()
			if _, err := io.WriteString(e.stdout, buildinfo.Line(buildinfo.Stamp{Version: stampedVersion, Commit: stampedCommit}, info)); err != nil {
				return fmt.Errorf("write: %w", err)
			}
			return nil
		},
	}
}
