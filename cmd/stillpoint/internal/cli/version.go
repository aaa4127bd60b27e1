package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Version is the release version, set at build time with
// -ldflags "-X github.com/stillpoint/stillpoint/cmd/stillpoint/internal/cli.Version=v0.1.0".
var Version = ""

// versionString returns the version, the VCS revision when the binary was
// built from a checkout, and the Go version.
func versionString() string {
	v, rev, dirty := Version, "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" {
		if dirty {
			rev += "-dirty"
		}
		v += " (" + rev + ")"
	}
	return fmt.Sprintf("stillpoint %s %s %s/%s, protocol v1", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(g.stdout, versionString())
			return nil
		},
	}
}
