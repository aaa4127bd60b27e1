package sandboxclient

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// ServiceError is the error a daemon answers a refusal with: its Code is
// one of the sandboxapi Code constants.
type ServiceError = jetstream.ServiceError

// Client calls one sandbox daemon's service. Its errors are *ServiceError
// with one of the sandboxapi Code constants, or the connection's
// (nats.ErrNoResponders while the daemon is not up).
type Client struct {
	svc *jetstream.ServiceClient
}

// New returns a client of the daemon of sandbox sandboxID in run, over nc.
func New(nc *nats.Conn, run, sandboxID string) (*Client, error) {
	subject, err := sandboxapi.ServiceSubject(run, sandboxID)
	if err != nil {
		return nil, err
	}
	return &Client{svc: jetstream.NewServiceClient(nc, subject)}, nil
}

// Launch starts a launch.
func (c *Client) Launch(ctx context.Context, r sandboxapi.LaunchRequest) (sandboxapi.Record, error) {
	var out sandboxapi.Record
	return out, c.svc.Call(ctx, sandboxapi.EndpointLaunch, r, &out)
}

// Status returns a launch's record.
func (c *Client) Status(ctx context.Context, id string) (sandboxapi.Record, error) {
	var out sandboxapi.Record
	return out, c.svc.Call(ctx, sandboxapi.EndpointStatus, sandboxapi.LaunchRef{LaunchID: id}, &out)
}

// Pause pauses a launch (mode "" for its own).
func (c *Client) Pause(ctx context.Context, id, mode string) (sandboxapi.PauseResult, error) {
	var out sandboxapi.PauseResult
	return out, c.svc.Call(ctx, sandboxapi.EndpointPause, sandboxapi.LaunchRef{LaunchID: id, Mode: mode}, &out)
}

// Continue continues a paused launch.
func (c *Client) Continue(ctx context.Context, id string) (sandboxapi.PauseResult, error) {
	var out sandboxapi.PauseResult
	return out, c.svc.Call(ctx, sandboxapi.EndpointContinue, sandboxapi.LaunchRef{LaunchID: id}, &out)
}

// Stop stops a launch (cancel: at once, without the SIGINT grace).
func (c *Client) Stop(ctx context.Context, id string, cancel bool) (sandboxapi.Receipt, error) {
	var out sandboxapi.Receipt
	return out, c.svc.Call(ctx, sandboxapi.EndpointStop, sandboxapi.LaunchRef{LaunchID: id, Cancel: cancel}, &out)
}

// Receipt returns a launch's receipt; with wait, once it has ended.
func (c *Client) Receipt(ctx context.Context, id string, wait bool) (sandboxapi.Receipt, error) {
	var out sandboxapi.Receipt
	return out, c.svc.Call(ctx, sandboxapi.EndpointReceipt, sandboxapi.LaunchRef{LaunchID: id, Wait: wait}, &out)
}

// WaitReceipt waits at most d for launch id to end: its receipt, or a
// ServiceError with sandboxapi.CodeNotEnded.
func (c *Client) WaitReceipt(ctx context.Context, id string, d time.Duration) (sandboxapi.Receipt, error) {
	var out sandboxapi.Receipt
	return out, c.svc.Call(ctx, sandboxapi.EndpointReceipt, sandboxapi.LaunchRef{LaunchID: id, Wait: true, WaitMS: max(d.Milliseconds(), 1)}, &out)
}

// Held asks whether launch id is still held in pause seq by supervisor
// identity.
func (c *Client) Held(ctx context.Context, id string, seq int, identity sandboxapi.Identity) (sandboxapi.HeldAnswer, error) {
	var out sandboxapi.HeldAnswer
	return out, c.svc.Call(ctx, sandboxapi.EndpointHeld, sandboxapi.HeldRequest{LaunchID: id, PauseSeq: seq, Identity: identity}, &out)
}

// Resume continues pause seq of launch id, held by a checkpoint from
// before a restore, if identity still owns it: the take-over.
func (c *Client) Resume(ctx context.Context, id string, seq int, identity sandboxapi.Identity) (sandboxapi.PauseResult, error) {
	var out sandboxapi.PauseResult
	return out, c.svc.Call(ctx, sandboxapi.EndpointResume, sandboxapi.ResumeRequest{LaunchID: id, PauseSeq: seq, Identity: identity}, &out)
}

// Collect returns the receipt of launch id, which ended while held, and
// clears the checkpoint's mark on it.
func (c *Client) Collect(ctx context.Context, id string, identity sandboxapi.Identity) (sandboxapi.Receipt, error) {
	var out sandboxapi.Receipt
	return out, c.svc.Call(ctx, sandboxapi.EndpointCollect, sandboxapi.CollectRequest{LaunchID: id, Identity: identity}, &out)
}

// RelayStatus returns the model relay's status.
func (c *Client) RelayStatus(ctx context.Context) (sandboxapi.RelayStatus, error) {
	var out sandboxapi.RelayStatus
	return out, c.svc.Call(ctx, sandboxapi.EndpointRelayStatus, struct{}{}, &out)
}

// Trajectory reads a chunk of the relay's capture file.
func (c *Client) Trajectory(ctx context.Context, r sandboxapi.TrajectoryRequest) (sandboxapi.TrajectoryChunk, error) {
	var out sandboxapi.TrajectoryChunk
	return out, c.svc.Call(ctx, sandboxapi.EndpointTrajectory, r, &out)
}

// Repoint re-points the model relay at url with generation gen.
func (c *Client) Repoint(ctx context.Context, url string, gen uint64) (sandboxapi.RelayStatus, error) {
	return c.RepointWith(ctx, sandboxapi.RepointRequest{URL: url, Generation: gen})
}

// RepointWith re-points the model relay as r says (a branch's label too).
func (c *Client) RepointWith(ctx context.Context, r sandboxapi.RepointRequest) (sandboxapi.RelayStatus, error) {
	var out sandboxapi.RelayStatus
	return out, c.svc.Call(ctx, sandboxapi.EndpointRelayRepoint, r, &out)
}
