package relay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// Relay is the model relay. Create it with New; Run (or Serve) serves it;
// Hold, Release, Repoint and Status may be called from any goroutine,
// before, during and after Run.
type Relay struct {
	cfg    Config
	log    zerolog.Logger
	client *http.Client

	mu       sync.Mutex
	holding  bool
	upstream string
	gen      uint64
	url      string // the URL a harness is given, once listening
	up       bool
	seq      uint64
	open     map[uint64]*call
	reading  int   // calls whose request body is being read (they count as open)
	used     int64 // bytes the open calls keep: request bodies, reply bytes not yet delivered
	counts   sandboxapi.RelayCounts
	changed  chan struct{} // closed (and replaced) when the hold ends or kept bytes are freed
	stopping chan struct{} // closed when Serve is returning
	handlers sync.WaitGroup

	// The capture's: the label of the calls taken now, the last number
	// given in each launch, and the counts of CaptureStatus.
	episode, launch string
	nums            map[string]int
	capture         sandboxapi.CaptureStatus
	// edits are the relay edits of the launch Label named last.
	edits []Edit
	// branch is the branch label in force (branch.go), nil for none.
	branch *sandboxapi.BranchLabel
}

// New checks cfg and returns a relay that is not yet serving.
func New(cfg Config) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	return &Relay{cfg: cfg, log: cfg.Logger.With().Str("component", "relay").Logger(),
		client:   &http.Client{Transport: cfg.Transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		upstream: strings.TrimRight(cfg.Upstream, "/"), open: map[uint64]*call{}, changed: make(chan struct{}), stopping: make(chan struct{}),
		nums: map[string]int{}}, nil
}

// Label names the launch the calls taken from now on belong to: episode
// (the rollout attempt) and launchID, the launch's id, which may begin
// with "<episode>." (the launch part of a call's id is the rest); and the
// relay edits (edits.go) applied to each of its requests, by name. The
// edits apply with or without Config.Capture; the label is the capture's
// and does nothing without it. An unknown edit name is an error wrapping
// ErrUnknownEdit: the label and the known edits are taken all the same.
// A label that makes no call id is an error too: the launch's calls are
// then not captured (none is put under the launch before), and its edits
// are taken all the same, since what they remove must not reach the
// model whatever the capture does (the daemon logs a Label error and the
// launch goes on).
func (r *Relay) Label(episode, launchID string, edits []string) error {
	return r.LabelBranch(episode, launchID, edits, nil)
}

// LabelBranch is Label for a launch of a branch: the calls taken from now
// on, and those sent again, go upstream with branch's label and seed
// (branch.go); a nil branch is no branch's launch, and clears the label.
// An invalid label is an error wrapping sandboxapi.ErrBadBranch, and
// nothing is labelled.
func (r *Relay) LabelBranch(episode, launchID string, edits []string, branch *sandboxapi.BranchLabel) error {
	if branch != nil {
		if err := branch.Validate(); err != nil {
			return fmt.Errorf("relay: label: %w", err)
		}
		b := *branch
		branch = &b
	}
	eds, eerr := LookupEdits(edits)
	if eerr != nil {
		eerr = fmt.Errorf("relay: label: %w", eerr)
	}
	launch := strings.TrimPrefix(launchID, episode+".")
	var lerr error
	if r.cfg.Capture != nil {
		if _, err := trajectory.CallID(episode, launch, 1); err != nil {
			lerr = fmt.Errorf("relay: label: %w", err)
			episode, launch = "", ""
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.edits, r.branch = eds, branch
	if r.cfg.Capture != nil {
		r.episode, r.launch = episode, launch
	}
	return errors.Join(lerr, eerr)
}

// Run listens on Config.Listen and serves until ctx ends (see Listen and
// Serve).
func (r *Relay) Run(ctx context.Context) error {
	ln, err := r.Listen(ctx)
	if err != nil {
		return err
	}
	return r.Serve(ctx, ln)
}

// Listen opens the listener on Config.Listen and reports the relay up at
// its address from then on, before Serve takes the listener: a daemon
// that answers relay_status as soon as it joins finds the relay up when
// its process listens, never a relay that its goroutine has yet to start.
func (r *Relay) Listen(ctx context.Context) (net.Listener, error) {
	if r.cfg.Listen == "" {
		return nil, errors.New("relay: Config.Listen is required by Listen")
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", r.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	r.mu.Lock()
	r.url, r.up = "http://"+ln.Addr().String(), true
	r.mu.Unlock()
	return ln, nil
}

// Serve serves on ln until ctx ends, then closes every connection, waits
// for every handler (and the upstream reads they started) and closes the
// capture file. A relay is served once.
func (r *Relay) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: r, BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) }}
	r.mu.Lock()
	r.url, r.up = "http://"+ln.Addr().String(), true
	r.mu.Unlock()
	r.log.Info().Str("url", r.url).Str("upstream", r.Upstream()).Msg("model relay listening")
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	served := false
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		served = true
	}
	r.mu.Lock()
	r.up = false
	close(r.stopping)
	r.mu.Unlock()
	_ = srv.Close()
	if !served {
		err = <-errc
	}
	r.handlers.Wait()
	if r.cfg.Capture != nil {
		if cerr := r.cfg.Capture.Close(); cerr != nil {
			r.log.Error().Err(cerr).Msg("closing the capture file")
		}
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// URL returns the URL a harness is given ("" before Serve).
func (r *Relay) URL() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.url
}

// Upstream returns the current upstream URL.
func (r *Relay) Upstream() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.upstream
}

// Status returns the relay's status.
func (r *Relay) Status() sandboxapi.RelayStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := sandboxapi.RelayStatus{Up: r.up, URL: r.url, Upstream: r.upstream, Generation: r.gen, Holding: r.holding, Calls: r.counts, KeptBytes: r.used}
	if r.branch != nil {
		b := *r.branch
		st.Branch = &b
	}
	for _, c := range r.open {
		switch c.state {
		case sandboxapi.CallHeld:
			st.Calls.Held++
		case sandboxapi.CallForwarding, sandboxapi.CallReplied:
			st.Calls.InFlight++
		}
		st.Open = append(st.Open, c.snapshot())
	}
	sort.Slice(st.Open, func(i, j int) bool { return st.Open[i].Seq < st.Open[j].Seq })
	if r.cfg.Capture != nil {
		cs := r.capture
		cs.Path, cs.Tokens, cs.Episode, cs.Launch = r.cfg.Capture.Path(), r.cfg.Tokens, r.episode, r.launch
		cs.Calls = r.cfg.Capture.Len()
		st.Capture = &cs
	}
	return st
}
