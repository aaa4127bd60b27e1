package main

import (
	"os"
	"path/filepath"

	"github.com/stillpoint/stillpoint/cmd/sandboxd/internal/cli"
)

func main() {
	args := os.Args[1:]
	if os.Getpid() == 1 && filepath.Base(os.Args[0]) == "init" {
		// The kernel runs /init of the initramfs with the words of its
		// command line it does not know: sandboxd is the guest's init.
		args = []string{"init"}
	}
	os.Exit(cli.Main(args, os.Stdout, os.Stderr))
}
