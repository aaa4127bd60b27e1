package relay

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/rs/zerolog"
)

// DefaultMaxRequestBytes is the largest request body the relay takes.
const DefaultMaxRequestBytes = 32 << 20

// Config configures a Relay.
type Config struct {
	// Listen is the address Run listens on (host:port). Required by Run;
	// Serve takes a listener instead.
	Listen string
	// Upstream is the URL of the first upstream (generation 0), the
	// request's path appended to it; empty until a Repoint.
	Upstream string
	// MaxRequestBytes bounds a request body (default
	// DefaultMaxRequestBytes).
	MaxRequestBytes int64
	// Transport makes the upstream requests (default: a clone of
	// http.DefaultTransport without compression, so bytes pass as they
	// are).
	Transport http.RoundTripper
	// Logger receives the relay's logs.
	Logger zerolog.Logger
}

func (c *Config) setDefaults() {
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if c.Transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.DisableCompression = true
		t.MaxIdleConnsPerHost = 64
		t.IdleConnTimeout = 90 * time.Second
		c.Transport = t
	}
}

// Validate reports every problem of c, each naming the field.
func (c Config) Validate() error {
	var errs []error
	if c.Listen != "" {
		if _, _, err := net.SplitHostPort(c.Listen); err != nil {
			errs = append(errs, fmt.Errorf("relay: Config.Listen: %w", err))
		}
	}
	if c.Upstream != "" {
		if err := checkUpstream(c.Upstream); err != nil {
			errs = append(errs, fmt.Errorf("relay: Config.Upstream: %w", err))
		}
	}
	if c.MaxRequestBytes < 0 {
		errs = append(errs, errors.New("relay: Config.MaxRequestBytes must not be negative"))
	}
	return errors.Join(errs...)
}
