package demo

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
)

// roleCreds returns the path of the run's credentials of role (with --auth or --auth-dir).
func (d *Fleet) roleCreds(role embedded.Role) string {
	return embedded.CredsFile(embedded.RunDir(d.authDir, d.run), role)
}

// provisionWait bounds how long the demo waits for a server given --auth-dir to provision a
// run's bus it has just added (the server looks at its auth dir every second).
const provisionWait = 30 * time.Second

// openBus connects and opens the run's bus, waiting up to provisionWait for a server that
// provisions it in a new run's account (the account unknown to it yet, or its bus not made).
func (d *Fleet) openBus(ctx context.Context, conn jetstream.ConnConfig) (*nats.Conn, natsjs.JetStream, *jetstream.Bus, error) {
	deadline := time.Now().Add(provisionWait)
	for {
		nc, js, err := ConnectJS(ctx, conn)
		if err == nil {
			var bus *jetstream.Bus
			if bus, err = jetstream.Open(ctx, js); err == nil {
				return nc, js, bus, nil
			}
			nc.Close()
		}
		if d.authDir == "" || time.Now().After(deadline) {
			return nil, nil, nil, err
		}
		select {
		case <-ctx.Done():
			return nil, nil, nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// ConnectJS connects and returns the connection with its JetStream handle.
func ConnectJS(ctx context.Context, conn jetstream.ConnConfig) (*nats.Conn, natsjs.JetStream, error) {
	nc, err := jetstream.Connect(ctx, conn)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}
