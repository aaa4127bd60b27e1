package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/stillpoint/stillpoint/participants/opencode/driver"
)

// main: the first SIGINT or SIGTERM cancels (the driver kills OpenCode and
// exits), a second one exits at once.
func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	code := driver.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
