package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
)

// Client calls one bridge.
type Client struct {
	base  string
	token string
	http  *http.Client
}

// Error is a non-2xx answer of the bridge.
type Error struct {
	// Status is the HTTP status; Code and Detail the bridge's error.
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

// Close closes the connections the client keeps open between calls, and
// with them their goroutines. A call after Close opens a new one.
func (c *Client) Close() {
	c.http.CloseIdleConnections()
}

// Checkpoint asks for a checkpoint; a result with Status failed is not an
// error.
func (c *Client) Checkpoint(ctx context.Context, req bridgeapi.CheckpointRequest) (*bridgeapi.CheckpointResult, error) {
	var res bridgeapi.CheckpointResult
	return &res, c.do(ctx, http.MethodPost, bridgeapi.PathCheckpoints, req, &res)
}

// Commit commits a checkpoint held prepared.
func (c *Client) Commit(ctx context.Context, id string, stop bool) (*bridgeapi.CheckpointResult, error) {
	var res bridgeapi.CheckpointResult
	return &res, c.do(ctx, http.MethodPost, bridgeapi.CommitPath(id), bridgeapi.CommitRequest{Stop: stop}, &res)
}

// Abort abandons a checkpoint held prepared.
func (c *Client) Abort(ctx context.Context, id string) (*bridgeapi.CheckpointResult, error) {
	var res bridgeapi.CheckpointResult
	return &res, c.do(ctx, http.MethodPost, bridgeapi.AbortPath(id), nil, &res)
}

// Get returns the result of a finished checkpoint.
func (c *Client) Get(ctx context.Context, id string) (*bridgeapi.CheckpointResult, error) {
	var res bridgeapi.CheckpointResult
	return &res, c.do(ctx, http.MethodGet, bridgeapi.CheckpointPath(id), nil, &res)
}

// Restore restores a checkpoint (LATEST when req.Source is empty).
func (c *Client) Restore(ctx context.Context, req bridgeapi.RestoreRequest) (*bridgeapi.RestoreResult, error) {
	var res bridgeapi.RestoreResult
	return &res, c.do(ctx, http.MethodPost, bridgeapi.PathRestore, req, &res)
}

// Retire refuses the given attempts everywhere from now on.
func (c *Client) Retire(ctx context.Context, episodes []string) (*bridgeapi.OpResult, error) {
	var res bridgeapi.OpResult
	return &res, c.do(ctx, http.MethodPost, bridgeapi.PathRetire, bridgeapi.RetireRequest{Episodes: episodes}, &res)
}

// Forget drops the refusal marks of rollouts.
func (c *Client) Forget(ctx context.Context, rollouts []string) (*bridgeapi.OpResult, error) {
	var res bridgeapi.OpResult
	return &res, c.do(ctx, http.MethodPost, bridgeapi.PathForget, bridgeapi.ForgetRequest{Rollouts: rollouts}, &res)
}

// Release deletes what no kept checkpoint names.
func (c *Client) Release(ctx context.Context, req bridgeapi.ReleaseRequest) (*bridgeapi.OpResult, error) {
	var res bridgeapi.OpResult
	return &res, c.do(ctx, http.MethodPost, bridgeapi.PathRelease, req, &res)
}

// Status reads the run's state.
func (c *Client) Status(ctx context.Context) (*bridgeapi.Status, error) {
	var res bridgeapi.Status
	return &res, c.do(ctx, http.MethodGet, bridgeapi.PathStatus, nil, &res)
}

// Ready waits until the bridge answers /healthz or ctx ends.
func (c *Client) Ready(ctx context.Context) error {
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.base+bridgeapi.PathHealth, nil)
		resp, err := c.http.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("client: bridge at %s not ready: %w", c.base, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
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
