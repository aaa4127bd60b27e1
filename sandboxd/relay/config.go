package relay

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// Defaults of Config.
const (
	// DefaultMaxRequestBytes is the largest request body the relay takes.
	DefaultMaxRequestBytes = 32 << 20
	// DefaultMaxOpenCalls is how many calls the relay keeps open at once.
	DefaultMaxOpenCalls = 64
	// DefaultMaxOpenBytes is how many bytes the open calls keep in all:
	// their request bodies and the reply bytes not yet delivered.
	DefaultMaxOpenBytes = 256 << 20
	// DefaultMaxKeptReply is the largest plain reply the relay keeps whole
	// until its end.
	DefaultMaxKeptReply = 32 << 20
	// DefaultUnreachableFor is how long a call is dialed again while its
	// upstream cannot be reached.
	DefaultUnreachableFor = 5 * time.Minute
)

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
	// MaxOpenCalls bounds the calls open at once, being read, held, in
	// flight or being delivered (default DefaultMaxOpenCalls): one more is
	// refused at once, 503 too_many_calls, before its body is read.
	MaxOpenCalls int
	// MaxOpenBytes bounds the bytes the open calls keep in sandboxd's
	// memory: request bodies (kept for a re-send until the call ends) and
	// reply bytes not yet delivered, those a capture or a translation
	// keeps until the reply's end among them (default DefaultMaxOpenBytes). A
	// request that would pass it is refused, 503 too_many_calls; a reply
	// past it is read on only as the harness takes what is kept (one read
	// of 32 KiB at a time), and not at all while the relay holds.
	MaxOpenBytes int64
	// MaxKeptReply bounds a plain (not streamed) reply the relay keeps
	// whole until its end, to record or translate it (default
	// DefaultMaxKeptReply): past it a native reply passes as it comes, and
	// a translated one fails its call, its harness told why.
	MaxKeptReply int
	// UnreachableFor is how long a call whose upstream cannot be reached
	// (no connection was made: refused, no route, a dial that timed out)
	// is dialed again, from 250 ms apart up to 5 s apart, before its
	// harness is told (default DefaultUnreachableFor; negative: told at
	// once). The request never left, so dialing again repeats no model
	// call: a partition or a model server that restarts is the
	// infrastructure's fault, not the rollout's.
	UnreachableFor time.Duration
	// Transport makes the upstream requests (default: a clone of
	// http.DefaultTransport without compression, so bytes pass as they
	// are).
	Transport http.RoundTripper
	// Capture, when set, records every call the upstream answered in the
	// sandbox's capture file (docs/TRAJECTORIES.md) before the end of its
	// reply reaches the harness, so a snapshot holds every call whose
	// reply its harness could have; Durable and Flush tell when the disk
	// has them. Calls are attributed to the launch Label names; a call
	// taken with no label is not recorded (the status counts it). The
	// relay closes it when Serve returns.
	Capture *trajectory.Recorder
	// Tokens asks the upstream for the prompt's and the completion's
	// token ids and the logprobs (return_token_ids true; logprobs true and
	// top_logprobs 0 unless the harness asked for logprobs itself), and
	// strips from each reply what the harness did not ask for. Only with
	// Capture.
	Tokens bool
	// Translate sends each Anthropic Messages and OpenAI Responses
	// request upstream as a chat completion (translate.go), and its reply
	// back in the API the harness spoke, so that the capture gets token
	// ids where the upstream returns them only on chat completions (vLLM).
	Translate bool
	// Logger receives the relay's logs.
	Logger zerolog.Logger
}

func (c *Config) setDefaults() {
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if c.MaxOpenCalls == 0 {
		c.MaxOpenCalls = DefaultMaxOpenCalls
	}
	if c.MaxOpenBytes == 0 {
		c.MaxOpenBytes = DefaultMaxOpenBytes
	}
	if c.MaxKeptReply == 0 {
		c.MaxKeptReply = DefaultMaxKeptReply
	}
	if c.UnreachableFor == 0 {
		c.UnreachableFor = DefaultUnreachableFor
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
	if c.MaxOpenCalls < 0 {
		errs = append(errs, errors.New("relay: Config.MaxOpenCalls must not be negative"))
	}
	if c.Tokens && c.Capture == nil {
		errs = append(errs, errors.New("relay: Config.Tokens needs Config.Capture"))
	}
	if c.MaxOpenBytes < 0 {
		errs = append(errs, errors.New("relay: Config.MaxOpenBytes must not be negative"))
	}
	return errors.Join(errs...)
}
