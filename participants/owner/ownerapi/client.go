package ownerapi

import (
	"context"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// Subject returns the subject prefix of owner name's service in run,
// spsvc.<run>.owner.<name>.
func Subject(run, name string) string {
	return events.ServiceSubject(run, events.Member(string(events.KindOwner)+"."+name))
}

// Client calls one owner's service. Its methods are safe for concurrent
// use; a refusal is a *jetstream.ServiceError.
type Client struct {
	svc *jetstream.ServiceClient
}

// NewClient returns a client of owner name of run over nc.
func NewClient(nc *nats.Conn, run, name string) (*Client, error) {
	if err := events.ValidateRun(run); err != nil {
		return nil, err
	}
	if err := events.ValidateToken("owner", name); err != nil {
		return nil, err
	}
	return &Client{svc: jetstream.NewServiceClient(nc, Subject(run, name))}, nil
}

// SeedSession asks for the sandbox of a session.
func (c *Client) SeedSession(ctx context.Context, r SeedRequest) (SessionInfo, error) {
	var out SessionInfo
	return out, c.svc.Call(ctx, EndpointSeed, r, &out)
}

// SandboxAccess returns the current sandbox of a session (a fork after a
// restore).
func (c *Client) SandboxAccess(ctx context.Context, sessionID string) (SessionInfo, error) {
	var out SessionInfo
	return out, c.svc.Call(ctx, EndpointAccess, SessionRef{SessionID: sessionID}, &out)
}

// Verify grades a session.
func (c *Client) Verify(ctx context.Context, sessionID string) (VerifyResult, error) {
	return c.VerifyEnd(ctx, VerifyRequest{SessionID: sessionID})
}

// VerifyEnd grades a session and, with r.End, ends it.
func (c *Client) VerifyEnd(ctx context.Context, r VerifyRequest) (VerifyResult, error) {
	var out VerifyResult
	return out, c.svc.Call(ctx, EndpointVerify, r, &out)
}

// CloseSession ends a session without a verdict.
func (c *Client) CloseSession(ctx context.Context, sessionID string) error {
	var out struct{}
	return c.svc.Call(ctx, EndpointClose, SessionRef{SessionID: sessionID}, &out)
}

// SetClock sets the wall clock of a session's sandbox (r.Wall, or the
// host's time when it is zero).
func (c *Client) SetClock(ctx context.Context, r ClockRequest) (ClockResult, error) {
	var out ClockResult
	return out, c.svc.Call(ctx, EndpointClock, r, &out)
}
