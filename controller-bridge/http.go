package bridge

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/stillpoint/stillpoint/events"
)

// MaxRequestBody bounds an API request body.
const MaxRequestBody = 1 << 20

// APIError is the body of every non-2xx answer: {"error":{"code","detail"}}.
type APIError struct {
	Code   string `json:"code"`
	Detail string `json:"detail"`
}

// Error implements error.
func (e *APIError) Error() string { return e.Code + ": " + e.Detail }

// Handler returns the bridge's HTTP JSON API (docs/API.md). Every route
// but /healthz requires "Authorization: Bearer <token>", compared in
// constant time; an empty token turns authentication off.
func (b *Bridge) Handler(token string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "run": b.cfg.Run})
	})
	api := func(pattern string, h func(ctx context.Context, r *http.Request) (any, error)) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			if !authorized(r, token) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="stillpoint"`)
				writeError(w, http.StatusUnauthorized, &APIError{Code: "unauthorized", Detail: "missing or wrong bearer token"})
				return
			}
			res, err := h(r.Context(), r)
			if err != nil {
				status, apiErr := classify(err)
				b.log.Warn().Err(err).Str("route", pattern).Int("status", status).Msg("API request failed")
				writeError(w, status, apiErr)
				return
			}
			writeJSON(w, http.StatusOK, res)
		})
	}
	api("POST /v1/checkpoints", func(ctx context.Context, r *http.Request) (any, error) {
		var req CheckpointRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return b.Checkpoint(ctx, req)
	})
	api("GET /v1/checkpoints/{id}", func(ctx context.Context, r *http.Request) (any, error) {
		return b.Get(ctx, r.PathValue("id"))
	})
	api("POST /v1/checkpoints/{id}/commit", func(ctx context.Context, r *http.Request) (any, error) {
		var req struct {
			Stop bool `json:"stop"`
		}
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return b.Commit(ctx, r.PathValue("id"), req.Stop)
	})
	api("POST /v1/checkpoints/{id}/abort", func(ctx context.Context, r *http.Request) (any, error) {
		return b.Abort(ctx, r.PathValue("id"))
	})
	api("POST /v1/restore", func(ctx context.Context, r *http.Request) (any, error) {
		var req RestoreRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return b.Restore(ctx, req)
	})
	api("POST /v1/retire", func(ctx context.Context, r *http.Request) (any, error) {
		var req struct {
			Episodes []string `json:"episodes"`
		}
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return b.Retire(ctx, req.Episodes)
	})
	api("POST /v1/forget", func(ctx context.Context, r *http.Request) (any, error) {
		var req struct {
			Rollouts []string `json:"rollouts"`
		}
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return b.Forget(ctx, req.Rollouts)
	})
	api("POST /v1/release", func(ctx context.Context, r *http.Request) (any, error) {
		var req ReleaseRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return b.Release(ctx, req)
	})
	api("GET /v1/status", func(ctx context.Context, r *http.Request) (any, error) {
		return b.Status(ctx)
	})
	return mux
}

// Get returns the result of a checkpoint that committed or failed.
func (b *Bridge) Get(ctx context.Context, id string) (*CheckpointResult, error) {
	if err := events.ValidateCheckpointID(id); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	m, _, err := b.manifest(ctx, id)
	if err != nil {
		return nil, err
	}
	if m == nil {
		return nil, fmt.Errorf("%w: checkpoint %s of run %s", ErrNotFound, id, b.cfg.Run)
	}
	return resultOf(m), nil
}

func authorized(r *http.Request, token string) bool {
	if token == "" {
		return true
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}

// decode reads a JSON body strictly: an unknown field, trailing data or an
// oversized body is a bad request naming what is wrong. An empty body is
// an empty request.
func decode(r *http.Request, v any) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxRequestBody+1))
	if err != nil {
		return fmt.Errorf("%w: reading the body: %w", ErrBadRequest, err)
	}
	if len(body) > MaxRequestBody {
		return fmt.Errorf("%w: body over %d bytes", ErrBadRequest, MaxRequestBody)
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: body: %w", ErrBadRequest, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: body: trailing data after the JSON object", ErrBadRequest)
	}
	return nil
}

func classify(err error) (int, *APIError) {
	switch {
	case errors.Is(err, ErrBadRequest), errors.Is(err, events.ErrInvalid):
		return http.StatusBadRequest, &APIError{Code: "bad_request", Detail: err.Error()}
	case errors.Is(err, ErrNotFound):
		return http.StatusNotFound, &APIError{Code: "not_found", Detail: err.Error()}
	case errors.Is(err, ErrBusy):
		return http.StatusConflict, &APIError{Code: "checkpoint_conflict", Detail: err.Error()}
	case errors.Is(err, ErrFenced):
		return http.StatusConflict, &APIError{Code: "fenced", Detail: err.Error()}
	case errors.Is(err, ErrNoFreshMember):
		return http.StatusConflict, &APIError{Code: "no_fresh_member", Detail: err.Error()}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable, &APIError{Code: "cancelled", Detail: err.Error()}
	}
	return http.StatusInternalServerError, &APIError{Code: "internal", Detail: err.Error()}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, e *APIError) {
	writeJSON(w, status, map[string]*APIError{"error": e})
}
