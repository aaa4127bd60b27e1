package main

import (
	"os"
	"path/filepath"

	"github.com/stillpoint/stillpoint/cmd/sandboxd/internal/cli"
	"github.com/stillpoint/stillpoint/internal/signals"
)

func main() {
	// The owner reads the daemon's output through a pipe into its log. An
	// owner that died must not take its sandboxes with it.
	signals.SurviveBrokenPipe()
	args := os.Args[1:]
	if os.Getpid() == 1 && filepath.Base(os.Args[0]) == "init" {
		// The kernel runs /init of the initramfs with the words of its
		// command line it does not know: sandboxd is the guest's init.
		args = []string{"init"}
	}
	os.Exit(cli.Main(args, os.Stdout, os.Stderr))
}
