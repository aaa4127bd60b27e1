package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/micro"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/jetstream"
)

// endpoint is one operation of the controller API as both transports call
// it: the request's JSON body in, the result (marshalled as JSON) or an
// error out. The HTTP routes whose request is all in the body and the
// service's endpoints call the same ones.
type endpoint func(ctx context.Context, body []byte) (any, error)

// endpoints returns the API's operations by service endpoint name
// (bridgeapi.Endpoints).
func (b *Bridge) endpoints() map[string]endpoint {
	return map[string]endpoint{
		bridgeapi.EndpointCheckpoint: func(ctx context.Context, body []byte) (any, error) {
			var req bridgeapi.CheckpointRequest
			if err := decodeBody(body, &req); err != nil {
				return nil, err
			}
			return b.Checkpoint(ctx, req)
		},
		bridgeapi.EndpointCommitHeld: func(ctx context.Context, body []byte) (any, error) {
			req, err := heldRequest(body, true)
			if err != nil {
				return nil, err
			}
			return b.Commit(ctx, req.ID, req.Stop)
		},
		bridgeapi.EndpointAbortHeld: func(ctx context.Context, body []byte) (any, error) {
			req, err := heldRequest(body, false)
			if err != nil {
				return nil, err
			}
			return b.Abort(ctx, req.ID)
		},
		bridgeapi.EndpointGet: func(ctx context.Context, body []byte) (any, error) {
			req, err := heldRequest(body, false)
			if err != nil {
				return nil, err
			}
			return b.Get(ctx, req.ID)
		},
		bridgeapi.EndpointRestore: func(ctx context.Context, body []byte) (any, error) {
			var req bridgeapi.RestoreRequest
			if err := decodeBody(body, &req); err != nil {
				return nil, err
			}
			return b.Restore(ctx, req)
		},
		bridgeapi.EndpointRetire: func(ctx context.Context, body []byte) (any, error) {
			var req bridgeapi.RetireRequest
			if err := decodeBody(body, &req); err != nil {
				return nil, err
			}
			return b.Retire(ctx, req.Episodes)
		},
		bridgeapi.EndpointForget: func(ctx context.Context, body []byte) (any, error) {
			var req bridgeapi.ForgetRequest
			if err := decodeBody(body, &req); err != nil {
				return nil, err
			}
			return b.Forget(ctx, req.Rollouts)
		},
		bridgeapi.EndpointRelease: func(ctx context.Context, body []byte) (any, error) {
			var req bridgeapi.ReleaseRequest
			if err := decodeBody(body, &req); err != nil {
				return nil, err
			}
			return b.Release(ctx, req)
		},
		bridgeapi.EndpointBranch: func(ctx context.Context, body []byte) (any, error) {
			var req bridgeapi.BranchRequest
			if err := decodeBody(body, &req); err != nil {
				return nil, err
			}
			return b.Branch(ctx, req)
		},
		bridgeapi.EndpointStatus: func(ctx context.Context, body []byte) (any, error) {
			var req struct{}
			if err := decodeBody(body, &req); err != nil {
				return nil, err
			}
			return b.Status(ctx)
		},
	}
}

// heldRequest decodes the body of commit-held, abort-held or get; stop is
// refused where it means nothing.
func heldRequest(body []byte, stop bool) (bridgeapi.HeldRequest, error) {
	var req bridgeapi.HeldRequest
	if err := decodeBody(body, &req); err != nil {
		return req, err
	}
	if req.Stop && !stop {
		return req, fmt.Errorf("%w: stop: only commit-held parks the fleet", bridgeapi.ErrBadRequest)
	}
	return req, req.Validate()
}

// Serve runs the controller API as the NATS micro service
// bridgeapi.ServiceName on the bridge's connection until ctx ends: the
// endpoints of bridgeapi.Endpoints under bridgeapi.ServiceSubject(run,
// name), each request served on a goroutine of its own (operations wait
// for the run's operation slot as over HTTP). An error answers with micro's
// error headers, the HTTP status of docs/API.md as the code, and the same
// JSON body as over HTTP. Who may call it is the bus's permissions' say
// (the controller role): the service takes no token. Serve waits for the
// requests in flight, whose contexts end with ctx, before it returns.
func (b *Bridge) Serve(ctx context.Context) error {
	svc, err := jetstream.NewService(b.cfg.Conn, micro.Config{
		Name:        bridgeapi.ServiceName,
		Version:     bridgeapi.ServiceVersion,
		Description: "controller bridge " + b.cfg.Name + " of run " + b.cfg.Run + " (docs/API.md)",
		Metadata:    map[string]string{"run": b.cfg.Run, "bridge": b.cfg.Name},
	}, bridgeapi.ServiceSubject(b.cfg.Run, b.cfg.Name), func(err error) (int, string) {
		status, e := classify(err)
		return status, e.Code
	})
	if err != nil {
		return fmt.Errorf("bridge: %w", err)
	}
	svc.SetErrorBody(func(status int, code string, err error) []byte {
		body, _ := json.Marshal(map[string]*bridgeapi.APIError{"error": {Code: code, Detail: err.Error()}})
		return body
	})
	eps := b.endpoints()
	var errs []error
	for _, name := range bridgeapi.Endpoints() {
		fn := eps[name]
		errs = append(errs, svc.HandleAsync(ctx, name, func(ctx context.Context, body []byte) (any, error) {
			res, err := fn(ctx, body)
			if err != nil {
				status, _ := classify(err)
				b.log.Warn().Err(err).Str("endpoint", name).Int("status", status).Msg("API request failed")
			}
			return res, err
		}))
	}
	if err := errors.Join(errs...); err != nil {
		_ = svc.Stop()
		return fmt.Errorf("bridge: service endpoints: %w", err)
	}
	b.log.Info().Str("subject", bridgeapi.ServiceSubject(b.cfg.Run, b.cfg.Name)+".>").Msg("bridge service serving")
	<-ctx.Done()
	return svc.Stop()
}
