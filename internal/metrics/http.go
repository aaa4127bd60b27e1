package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The routes Handler serves.
const (
	PathMetrics = "/metrics"
	PathHealth  = "/healthz"
	PathReady   = "/readyz"
)

// ErrNotReady is returned (wrapped, naming what is missing) by a Probe
// that fails.
var ErrNotReady = errors.New("metrics: not ready")

// probeTimeout bounds one /readyz answer.
const probeTimeout = 2 * time.Second

// Probe tells whether the process is ready: nil when it is, else an error
// that says what is missing.
type Probe func(ctx context.Context) error

// All is a Probe that passes when every probe passes; it returns the first
// failure.
func All(probes ...Probe) Probe {
	return func(ctx context.Context) error {
		for _, p := range probes {
			if p == nil {
				continue
			}
			if err := p(ctx); err != nil {
				return err
			}
		}
		return nil
	}
}

// Connected is a Probe that passes while nc is connected to a server.
func Connected(nc *nats.Conn) Probe {
	return func(context.Context) error {
		if nc == nil || !nc.IsConnected() {
			st := "no connection"
			if nc != nil {
				st = nc.Status().String()
			}
			return fmt.Errorf("%w: NATS %s", ErrNotReady, st)
		}
		return nil
	}
}

// StreamAnswers is a Probe that passes when JetStream answers for the
// stream: a round trip to the server that holds it.
func StreamAnswers(st natsjs.Stream) Probe {
	return func(ctx context.Context) error {
		if st == nil {
			return fmt.Errorf("%w: no stream", ErrNotReady)
		}
		if _, err := st.Info(ctx); err != nil {
			return fmt.Errorf("%w: stream %s: %w", ErrNotReady, st.CachedInfo().Config.Name, err)
		}
		return nil
	}
}

// ConsumerLive is a Probe that passes when the durable consumer name
// exists on the stream (a member's consumer, PROTOCOL §3, Consumers).
func ConsumerLive(st natsjs.Stream, name string) Probe {
	return func(ctx context.Context) error {
		if st == nil {
			return fmt.Errorf("%w: no stream", ErrNotReady)
		}
		if _, err := st.Consumer(ctx, name); err != nil {
			return fmt.Errorf("%w: consumer %s: %w", ErrNotReady, name, err)
		}
		return nil
	}
}

// Closed is a Probe that passes once ch is closed (a member's Joined).
func Closed(what string, ch <-chan struct{}) Probe {
	return func(context.Context) error {
		select {
		case <-ch:
			return nil
		default:
			return fmt.Errorf("%w: %s", ErrNotReady, what)
		}
	}
}

// Handler serves s on PathMetrics (404 when s is nil), PathHealth (200:
// the process is up) and PathReady (200 when ready passes, 503 with its
// error otherwise; a nil ready is always ready).
func Handler(s *Set, ready Probe) http.Handler {
	mux := http.NewServeMux()
	Mount(mux, s, ready)
	return mux
}

// Mount adds Handler's three routes (GET) to mux.
func Mount(mux *http.ServeMux, s *Set, ready Probe) {
	MountMetrics(mux, s)
	mux.HandleFunc("GET "+PathHealth, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET "+PathReady, ReadyHandler(ready))
}

// MountMetrics adds GET PathMetrics, s in the text exposition format, to
// mux; nothing when s is nil.
func MountMetrics(mux *http.ServeMux, s *Set) {
	if s != nil {
		mux.Handle("GET "+PathMetrics, promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}))
	}
}

// ReadyHandler answers PathReady with ready: 200 "ready", or 503 with the
// probe's error.
func ReadyHandler(ready Probe) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if ready != nil {
			ctx, cancel := context.WithTimeout(r.Context(), probeTimeout)
			defer cancel()
			if err := ready(ctx); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = fmt.Fprintln(w, err)
				return
			}
		}
		_, _ = w.Write([]byte("ready\n"))
	}
}

// Serve serves h on ln until ctx ends, then shuts the server down (in-flight
// scrapes get a few seconds) and returns. It returns nil after ctx ends, or
// the server's error.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}
