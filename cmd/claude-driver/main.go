package main

import (
	"context"
	"os"

	"github.com/stillpoint/stillpoint/internal/signals"
	"github.com/stillpoint/stillpoint/participants/claude/driver"
)

// main: the first SIGINT or SIGTERM cancels (the driver kills Claude and
// exits), a second one exits at once.
func main() {
	ctx, sigs := signals.Notify(context.Background(), signals.Die)
	code := driver.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	sigs.Stop()
	os.Exit(code)
}
