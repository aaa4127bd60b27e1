package agentapi

import (
	"context"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// Client calls one agent's run endpoint.
type Client struct {
	svc *jetstream.ServiceClient
}

// NewClient returns a client of agent name of run over nc.
func NewClient(nc *nats.Conn, run, name string) (*Client, error) {
	if err := events.ValidateRun(run); err != nil {
		return nil, err
	}
	if err := events.ValidateToken("agent", name); err != nil {
		return nil, err
	}
	m, err := events.NewMember(events.KindAgent, name)
	if err != nil {
		return nil, err
	}
	return &Client{svc: jetstream.NewServiceClient(nc, events.ServiceSubject(run, m))}, nil
}

// Rollout runs a rollout on the agent and waits for its result (ctx bounds
// the wait, not the rollout: a request asked again joins the same run).
func (c *Client) Rollout(ctx context.Context, r Request) (Result, error) {
	var out Result
	return out, c.svc.Call(ctx, EndpointRun, r, &out)
}
