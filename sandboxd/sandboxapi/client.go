package sandboxapi

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// Client calls one sandbox daemon's service. Its errors are
// *jetstream.ServiceError with one of the Code constants, or the
// connection's (nats.ErrNoResponders while the daemon is not up).
type Client struct {
	svc *jetstream.ServiceClient
}

// NewClient returns a client of the daemon of sandbox sandboxID in run,
// over nc.
func NewClient(nc *nats.Conn, run, sandboxID string) (*Client, error) {
	if err := events.ValidateRun(run); err != nil {
		return nil, err
	}
	if err := events.ValidateToken("sandbox", sandboxID); err != nil {
		return nil, err
	}
	m, err := events.NewMember(events.KindSandbox, sandboxID)
	if err != nil {
		return nil, err
	}
	return &Client{svc: jetstream.NewServiceClient(nc, events.ServiceSubject(run, m))}, nil
}

// Launch starts a launch.
func (c *Client) Launch(ctx context.Context, r LaunchRequest) (Record, error) {
	var out Record
	return out, c.svc.Call(ctx, EndpointLaunch, r, &out)
}

// Status returns a launch's record.
func (c *Client) Status(ctx context.Context, id string) (Record, error) {
	var out Record
	return out, c.svc.Call(ctx, EndpointStatus, LaunchRef{LaunchID: id}, &out)
}

// Pause pauses a launch (mode "" for its own).
func (c *Client) Pause(ctx context.Context, id, mode string) (PauseResult, error) {
	var out PauseResult
	return out, c.svc.Call(ctx, EndpointPause, LaunchRef{LaunchID: id, Mode: mode}, &out)
}

// Continue continues a paused launch.
func (c *Client) Continue(ctx context.Context, id string) (PauseResult, error) {
	var out PauseResult
	return out, c.svc.Call(ctx, EndpointContinue, LaunchRef{LaunchID: id}, &out)
}

// Stop stops a launch (cancel: at once, without the SIGINT grace).
func (c *Client) Stop(ctx context.Context, id string, cancel bool) (Receipt, error) {
	var out Receipt
	return out, c.svc.Call(ctx, EndpointStop, LaunchRef{LaunchID: id, Cancel: cancel}, &out)
}

// Receipt returns a launch's receipt; with wait, once it has ended.
func (c *Client) Receipt(ctx context.Context, id string, wait bool) (Receipt, error) {
	var out Receipt
	return out, c.svc.Call(ctx, EndpointReceipt, LaunchRef{LaunchID: id, Wait: wait}, &out)
}

// WaitReceipt waits at most d for launch id to end: its receipt, or a
// ServiceError with CodeNotEnded.
func (c *Client) WaitReceipt(ctx context.Context, id string, d time.Duration) (Receipt, error) {
	var out Receipt
	return out, c.svc.Call(ctx, EndpointReceipt, LaunchRef{LaunchID: id, Wait: true, WaitMS: max(d.Milliseconds(), 1)}, &out)
}

// Held asks whether launch id is still held in pause seq by supervisor
// identity.
func (c *Client) Held(ctx context.Context, id string, seq int, identity Identity) (HeldAnswer, error) {
	var out HeldAnswer
	return out, c.svc.Call(ctx, EndpointHeld, HeldRequest{LaunchID: id, PauseSeq: seq, Identity: identity}, &out)
}

// Resume continues pause seq of launch id, held by a checkpoint from
// before a restore, if identity still owns it: the take-over.
func (c *Client) Resume(ctx context.Context, id string, seq int, identity Identity) (PauseResult, error) {
	var out PauseResult
	return out, c.svc.Call(ctx, EndpointResume, ResumeRequest{LaunchID: id, PauseSeq: seq, Identity: identity}, &out)
}

// Collect returns the receipt of launch id, which ended while held, and
// clears the checkpoint's mark on it.
func (c *Client) Collect(ctx context.Context, id string, identity Identity) (Receipt, error) {
	var out Receipt
	return out, c.svc.Call(ctx, EndpointCollect, CollectRequest{LaunchID: id, Identity: identity}, &out)
}

// RelayStatus returns the model relay's status.
func (c *Client) RelayStatus(ctx context.Context) (RelayStatus, error) {
	var out RelayStatus
	return out, c.svc.Call(ctx, EndpointRelayStatus, struct{}{}, &out)
}

// Trajectory reads a chunk of the relay's capture file.
func (c *Client) Trajectory(ctx context.Context, r TrajectoryRequest) (TrajectoryChunk, error) {
	var out TrajectoryChunk
	return out, c.svc.Call(ctx, EndpointTrajectory, r, &out)
}

// Repoint re-points the model relay at url with generation gen.
func (c *Client) Repoint(ctx context.Context, url string, gen uint64) (RelayStatus, error) {
	var out RelayStatus
	return out, c.svc.Call(ctx, EndpointRelayRepoint, RepointRequest{URL: url, Generation: gen}, &out)
}
