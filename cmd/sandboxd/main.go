package main

import (
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/stillpoint/stillpoint/cmd/sandboxd/internal/cli"
)

func main() {
	// The owner reads the daemon's output through a pipe into its log. An
	// owner that died must not take its sandboxes with it: a write to a
	// pipe nobody reads fails (EPIPE) instead of ending the process, as
	// it does when SIGPIPE is not asked for. A handler, unlike ignoring
	// the signal, is not inherited by the programs the daemon launches.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	args := os.Args[1:]
	if os.Getpid() == 1 && filepath.Base(os.Args[0]) == "init" {
		// The kernel runs /init of the initramfs with the words of its
		// command line it does not know: sandboxd is the guest's init.
		args = []string{"init"}
	}
	os.Exit(cli.Main(args, os.Stdout, os.Stderr))
}
