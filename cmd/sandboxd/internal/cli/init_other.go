//go:build !linux

package cli

import (
	"fmt"
	"io"
)

// initCmd is Linux only: it is the init of a Linux microVM.
func initCmd(_ []string, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "sandboxd init: Linux only")
	return 1
}
