package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
)

// Client calls one bridge, over HTTP (New) or NATS (NewNATS): the same
// methods, requests, results and errors on either transport.
type Client struct {
	// HTTP: the API's base URL, its bearer token and the client's own
	// connections.
	base  string
	token string
	http  *http.Client
	// NATS: the caller's connection and the service's subject prefix.
	nc      *nats.Conn
	subject string
}

// route is one operation as each transport spells it: an HTTP method,
// path and body, and a service endpoint and body.
type route struct {
	method, path string
	body         any
	endpoint     string
	request      any
}

// Error is a non-2xx answer of the bridge, or a service error answer.
type Error struct {
	// Status is the HTTP status (over NATS the service error code, the
	// same number); Code and Detail the bridge's error.
	Status int
	Code   string
	Detail string
}

// Error implements error.
func (e *Error) Error() string {
	return fmt.Sprintf("bridge: %s (HTTP %d): %s", e.Code, e.Status, e.Detail)
}

// New returns a client of the bridge at baseURL (http://host:port) that
// sends token as a bearer token. Operations wait as long as their phases
// do; bound them with the ctx of each call. The client keeps its
// connections to the bridge open between calls; Close closes them.
func New(baseURL, token string) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: bridge URL %q: want http(s)://host:port", baseURL)
	}
	// A transport of its own, so that Close closes this client's
	// connections, and ends their goroutines, and no one else's.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	return &Client{base: strings.TrimRight(baseURL, "/"), token: token, http: &http.Client{Transport: tr}}, nil
}

// NewNATS returns a client of the bridge service (bridgeapi.ServiceName)
// of bridge name of run ("" for the default, main) on nc, a connection the
// caller keeps and closes; its user needs the controller role's
// permissions. Operations wait as long as their phases do; bound them
// with the ctx of each call.
func NewNATS(nc *nats.Conn, run, name string) (*Client, error) {
	if nc == nil {
		return nil, errors.New("client: NATS connection required")
	}
	if err := events.ValidateRun(run); err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	if name != "" {
		if _, err := events.NewMember(events.KindBridge, name); err != nil {
			return nil, fmt.Errorf("client: bridge name: %w", err)
		}
	}
	return &Client{nc: nc, subject: bridgeapi.ServiceSubject(run, name)}, nil
}

// Close closes the connections the client keeps open between calls, and
// with them their goroutines. A call after Close opens a new one. Over
// NATS it does nothing: the connection is the caller's.
func (c *Client) Close() {
	if c.http != nil {
		c.http.CloseIdleConnections()
	}
}

// Checkpoint asks for a checkpoint; a result with Status failed is not an
// error.
func (c *Client) Checkpoint(ctx context.Context, req bridgeapi.CheckpointRequest) (*bridgeapi.CheckpointResult, error) {
	var res bridgeapi.CheckpointResult
	return &res, c.do(ctx, route{http.MethodPost, bridgeapi.PathCheckpoints, req, bridgeapi.EndpointCheckpoint, req}, &res)
}

// Commit commits a checkpoint held prepared.
func (c *Client) Commit(ctx context.Context, id string, stop bool) (*bridgeapi.CheckpointResult, error) {
	var res bridgeapi.CheckpointResult
	return &res, c.do(ctx, route{http.MethodPost, bridgeapi.CommitPath(id), bridgeapi.CommitRequest{Stop: stop},
		bridgeapi.EndpointCommitHeld, bridgeapi.HeldRequest{ID: id, Stop: stop}}, &res)
}

// Abort abandons a checkpoint held prepared.
func (c *Client) Abort(ctx context.Context, id string) (*bridgeapi.CheckpointResult, error) {
	var res bridgeapi.CheckpointResult
	return &res, c.do(ctx, route{http.MethodPost, bridgeapi.AbortPath(id), nil, bridgeapi.EndpointAbortHeld, bridgeapi.HeldRequest{ID: id}}, &res)
}

// Get returns the result of a finished checkpoint.
func (c *Client) Get(ctx context.Context, id string) (*bridgeapi.CheckpointResult, error) {
	var res bridgeapi.CheckpointResult
	return &res, c.do(ctx, route{http.MethodGet, bridgeapi.CheckpointPath(id), nil, bridgeapi.EndpointGet, bridgeapi.HeldRequest{ID: id}}, &res)
}

// Restore restores a checkpoint (LATEST when req.Source is empty).
func (c *Client) Restore(ctx context.Context, req bridgeapi.RestoreRequest) (*bridgeapi.RestoreResult, error) {
	var res bridgeapi.RestoreResult
	return &res, c.do(ctx, route{http.MethodPost, bridgeapi.PathRestore, req, bridgeapi.EndpointRestore, req}, &res)
}

// Branch forks rollouts of a checkpoint (LATEST when req.Source is empty)
// into branches that continue beside the fleet.
func (c *Client) Branch(ctx context.Context, req bridgeapi.BranchRequest) (*bridgeapi.BranchResult, error) {
	var res bridgeapi.BranchResult
	return &res, c.do(ctx, route{http.MethodPost, bridgeapi.PathBranch, req, bridgeapi.EndpointBranch, req}, &res)
}

// Retire refuses the given attempts everywhere from now on.
func (c *Client) Retire(ctx context.Context, episodes []string) (*bridgeapi.OpResult, error) {
	var res bridgeapi.OpResult
	req := bridgeapi.RetireRequest{Episodes: episodes}
	return &res, c.do(ctx, route{http.MethodPost, bridgeapi.PathRetire, req, bridgeapi.EndpointRetire, req}, &res)
}

// Forget drops the refusal marks of rollouts.
func (c *Client) Forget(ctx context.Context, rollouts []string) (*bridgeapi.OpResult, error) {
	var res bridgeapi.OpResult
	req := bridgeapi.ForgetRequest{Rollouts: rollouts}
	return &res, c.do(ctx, route{http.MethodPost, bridgeapi.PathForget, req, bridgeapi.EndpointForget, req}, &res)
}

// Release deletes what no kept checkpoint names.
func (c *Client) Release(ctx context.Context, req bridgeapi.ReleaseRequest) (*bridgeapi.OpResult, error) {
	var res bridgeapi.OpResult
	return &res, c.do(ctx, route{http.MethodPost, bridgeapi.PathRelease, req, bridgeapi.EndpointRelease, req}, &res)
}

// Status reads the run's state.
func (c *Client) Status(ctx context.Context) (*bridgeapi.Status, error) {
	var res bridgeapi.Status
	return &res, c.do(ctx, route{http.MethodGet, bridgeapi.PathStatus, nil, bridgeapi.EndpointStatus, struct{}{}}, &res)
}

// Ready waits until the bridge answers /healthz (over NATS: its status
// endpoint) or ctx ends.
func (c *Client) Ready(ctx context.Context) error {
	if c.nc != nil {
		return c.readyNATS(ctx)
	}
	// Over HTTP a refused connection and a status other than 200 alike
	// say "not yet": a wait for a condition (poll), not a request that
	// found no responder.
	err := poll.Until(ctx, poll.Every(50*time.Millisecond), func() (bool, error) {
		if ctx.Err() != nil {
			return false, nil
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.base+bridgeapi.PathHealth, nil)
		resp, err := c.http.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("client: bridge at %s not ready: %w", c.base, ctx.Err())
	}
	return nil
}

func (c *Client) do(ctx context.Context, r route, out any) error {
	if c.nc != nil {
		return c.request(ctx, r.endpoint, r.request, out)
	}
	return c.doHTTP(ctx, r.method, r.path, r.body, out)
}

func (c *Client) doHTTP(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("client: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("client: %s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error bridgeapi.APIError `json:"error"`
		}
		if json.Unmarshal(raw, &e) != nil || e.Error.Code == "" {
			return &Error{Status: resp.StatusCode, Code: "http_error", Detail: strings.TrimSpace(string(raw))}
		}
		return &Error{Status: resp.StatusCode, Code: e.Error.Code, Detail: e.Error.Detail}
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("client: %s %s: the answer does not decode: %w", method, path, err)
	}
	return nil
}
