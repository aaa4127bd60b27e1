package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/e2e/chaos"
	"github.com/stillpoint/stillpoint/jetstream"
)

func main() {
	var conn jetstream.ConnConfig
	var term atomic.Pointer[func()]
	cmd := chaos.Command(chaos.Env{Stdout: os.Stdout, Stderr: os.Stderr, Conn: &conn,
		HandleTerm: func(stop func()) func() {
			term.Store(&stop)
			return func() { term.Store(nil) }
		}})
	// The global flags of the stillpoint command, which the processes
	// chaos starts of its own binary (chaos collect) are given too.
	pf := cmd.PersistentFlags()
	pf.StringVar(&conn.URL, "nats-url", "", "NATS server URL (chaos collect)")
	pf.StringVar(&conn.CredsFile, "creds", "", "NATS user credentials file (chaos collect)")
	pf.String("log-level", "info", "accepted as stillpoint takes it")
	pf.String("log-format", "auto", "accepted as stillpoint takes it")
	cmd.SilenceUsage, cmd.SilenceErrors = true, true

	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		for sig := range sigs {
			if h := term.Load(); h != nil && sig == syscall.SIGTERM {
				(*h)() // chaos collect stops after a checkpoint
				continue
			}
			cancel()
		}
	}()
	err := cmd.ExecuteContext(ctx)
	cancel()
	switch {
	case err == nil:
		return
	case errors.Is(err, chaos.ErrInvariants):
		os.Exit(1)
	case errors.Is(err, collect.ErrStopped):
		fmt.Fprintln(os.Stderr, err)
		os.Exit(collect.ExitStopped)
	case errors.Is(err, chaos.ErrUsage):
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}
