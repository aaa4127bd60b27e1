package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/stillpoint/stillpoint/participants/opencode/driver"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := driver.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
