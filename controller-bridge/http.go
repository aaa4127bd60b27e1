package bridge

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
)

// Handler returns the bridge's HTTP JSON API (docs/API.md). Every route
// but /healthz, /readyz and /metrics (docs/OPERATIONS.md) requires "Authorization: Bearer <token>" (the scheme in any
// case), compared in constant time; an empty token turns authentication
// off. Every answer is JSON, an unknown route (404) or a wrong method
// (405) included.
func (b *Bridge) Handler(token string) http.Handler {
	mux := http.NewServeMux()
	b.mountMetrics(mux)
	mux.HandleFunc("GET "+bridgeapi.PathHealth, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "run": b.cfg.Run})
	})
	api := func(pattern string, h func(ctx context.Context, r *http.Request) (any, error)) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			if !authorized(r, token) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="stillpoint"`)
				writeError(w, http.StatusUnauthorized, &bridgeapi.APIError{Code: "unauthorized", Detail: "missing or wrong bearer token"})
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
	// The routes whose request is all in the body call the service's
	// endpoints (service.go): one implementation behind both transports.
	eps := b.endpoints()
	body := func(name string) func(ctx context.Context, r *http.Request) (any, error) {
		return func(ctx context.Context, r *http.Request) (any, error) {
			raw, err := readBody(r)
			if err != nil {
				return nil, err
			}
			return eps[name](ctx, raw)
		}
	}
	api("POST "+bridgeapi.PathCheckpoints, body(bridgeapi.EndpointCheckpoint))
	api("GET "+bridgeapi.PathCheckpoint, func(ctx context.Context, r *http.Request) (any, error) {
		id, err := pathID(r)
		if err != nil {
			return nil, err
		}
		return b.Get(ctx, id)
	})
	api("POST "+bridgeapi.PathCommit, func(ctx context.Context, r *http.Request) (any, error) {
		id, err := pathID(r)
		if err != nil {
			return nil, err
		}
		var req bridgeapi.CommitRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return b.Commit(ctx, id, req.Stop)
	})
	api("POST "+bridgeapi.PathAbort, func(ctx context.Context, r *http.Request) (any, error) {
		id, err := pathID(r)
		if err != nil {
			return nil, err
		}
		return b.Abort(ctx, id)
	})
	api("POST "+bridgeapi.PathRestore, body(bridgeapi.EndpointRestore))
	api("POST "+bridgeapi.PathRetire, body(bridgeapi.EndpointRetire))
	api("POST "+bridgeapi.PathForget, body(bridgeapi.EndpointForget))
	api("POST "+bridgeapi.PathRelease, body(bridgeapi.EndpointRelease))
	api("POST "+bridgeapi.PathBranch, body(bridgeapi.EndpointBranch))
	api("GET "+bridgeapi.PathStatus, func(ctx context.Context, r *http.Request) (any, error) {
		return b.Status(ctx)
	})
	return jsonMisses(mux)
}

// jsonMisses answers what mux has no route for (404) or no such method
// for (405, with its Allow header) as JSON errors like any other, instead
// of net/http's plain text.
func jsonMisses(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			mux.ServeHTTP(w, r) // which sets the path's values
			return
		}
		// No pattern: net/http's own answer, a redirect to the cleaned
		// path included. Keep its status and headers, replace a 404 or 405
		// body.
		rec := &missRecorder{header: http.Header{}}
		h.ServeHTTP(rec, r)
		switch rec.status {
		case http.StatusNotFound:
			writeError(w, http.StatusNotFound, &bridgeapi.APIError{Code: "not_found", Detail: "no route " + r.URL.EscapedPath()})
		case http.StatusMethodNotAllowed:
			if allow := rec.header.Get("Allow"); allow != "" {
				w.Header().Set("Allow", allow)
			}
			writeError(w, http.StatusMethodNotAllowed, &bridgeapi.APIError{Code: "method_not_allowed",
				Detail: fmt.Sprintf("%s is not allowed on %s (allowed: %s)", r.Method, r.URL.EscapedPath(), rec.header.Get("Allow"))})
		default:
			for k, vs := range rec.header {
				w.Header()[k] = vs
			}
			w.WriteHeader(rec.status)
			_, _ = w.Write(rec.body)
		}
	})
}

// missRecorder keeps net/http's answer to a request no route matched.
type missRecorder struct {
	header http.Header
	status int
	body   []byte
}

func (m *missRecorder) Header() http.Header { return m.header }

func (m *missRecorder) WriteHeader(status int) {
	if m.status == 0 {
		m.status = status
	}
}

func (m *missRecorder) Write(p []byte) (int, error) {
	if m.status == 0 {
		m.status = http.StatusOK
	}
	m.body = append(m.body, p...)
	return len(p), nil
}

// pathID returns the checkpoint id of a route's {id}. The same refusal on
// every route: an id is a plain token, so a percent-encoded one (which
// net/http would decode, "a%2Fb" into "a/b") is a bad request, as is an
// invalid one.
func pathID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if strings.Contains(r.URL.EscapedPath(), "%") {
		return "", fmt.Errorf("%w: checkpoint_id in the path: percent-encoding is not allowed (%q)", bridgeapi.ErrBadRequest, r.URL.EscapedPath())
	}
	if err := events.ValidateCheckpointID(id); err != nil {
		return "", fmt.Errorf("%w: %w", bridgeapi.ErrBadRequest, err)
	}
	return id, nil
}

// Get returns the result of a checkpoint that committed or failed.
func (b *Bridge) Get(ctx context.Context, id string) (*bridgeapi.CheckpointResult, error) {
	if err := events.ValidateCheckpointID(id); err != nil {
		return nil, fmt.Errorf("%w: %w", bridgeapi.ErrBadRequest, err)
	}
	m, _, err := b.manifest(ctx, id)
	if err != nil {
		return nil, err
	}
	if m == nil {
		return nil, fmt.Errorf("%w: checkpoint %s of run %s", bridgeapi.ErrNotFound, id, b.cfg.Run)
	}
	return bridgeapi.ResultOf(m), nil
}

// authorized reports whether r carries the bearer token. The scheme is
// matched in any case (RFC 9110, 11.1); the token exactly.
func authorized(r *http.Request, token string) bool {
	if token == "" {
		return true
	}
	scheme, got, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	got = strings.TrimLeft(got, " ")
	return ok && strings.EqualFold(scheme, "Bearer") && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}

// decode reads r's JSON body strictly (readBody, decodeBody).
func decode(r *http.Request, v any) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	return decodeBody(body, v)
}

// readBody reads r's body: over MaxRequestBody bytes is ErrTooLarge.
func readBody(r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, bridgeapi.MaxRequestBody+1))
	if err != nil {
		return nil, fmt.Errorf("%w: reading the body: %w", bridgeapi.ErrBadRequest, err)
	}
	if len(body) > bridgeapi.MaxRequestBody {
		return nil, fmt.Errorf("%w: body over %d bytes", bridgeapi.ErrTooLarge, bridgeapi.MaxRequestBody)
	}
	return body, nil
}

// decodeBody decodes a request body strictly, as both transports do: an
// unknown field or trailing data is a bad request naming what is wrong, an
// oversized body ErrTooLarge. An empty body is an empty request.
func decodeBody(body []byte, v any) error {
	if len(body) > bridgeapi.MaxRequestBody {
		return fmt.Errorf("%w: body over %d bytes", bridgeapi.ErrTooLarge, bridgeapi.MaxRequestBody)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: body: %w", bridgeapi.ErrBadRequest, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: body: trailing data after the JSON object", bridgeapi.ErrBadRequest)
	}
	return nil
}

func classify(err error) (int, *bridgeapi.APIError) {
	switch {
	case errors.Is(err, bridgeapi.ErrTooLarge):
		return http.StatusRequestEntityTooLarge, &bridgeapi.APIError{Code: "too_large", Detail: err.Error()}
	case errors.Is(err, bridgeapi.ErrBadRequest), errors.Is(err, events.ErrInvalid):
		return http.StatusBadRequest, &bridgeapi.APIError{Code: "bad_request", Detail: err.Error()}
	case errors.Is(err, bridgeapi.ErrNotFound):
		return http.StatusNotFound, &bridgeapi.APIError{Code: "not_found", Detail: err.Error()}
	case errors.Is(err, bridgeapi.ErrBusy):
		return http.StatusConflict, &bridgeapi.APIError{Code: "checkpoint_conflict", Detail: err.Error()}
	case errors.Is(err, bridgeapi.ErrFenced):
		return http.StatusConflict, &bridgeapi.APIError{Code: "fenced", Detail: err.Error()}
	case errors.Is(err, bridgeapi.ErrReleased):
		return http.StatusConflict, &bridgeapi.APIError{Code: "checkpoint_released", Detail: err.Error()}
	case errors.Is(err, bridgeapi.ErrNoFreshMember):
		return http.StatusConflict, &bridgeapi.APIError{Code: "no_fresh_member", Detail: err.Error()}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable, &bridgeapi.APIError{Code: "cancelled", Detail: err.Error()}
	}
	return http.StatusInternalServerError, &bridgeapi.APIError{Code: "internal", Detail: err.Error()}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, e *bridgeapi.APIError) {
	writeJSON(w, status, map[string]*bridgeapi.APIError{"error": e})
}
