package jetstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Reconnect behaviour of Connect. A member must ride out a server restart or a cluster failover
// (4–9 s for a crashed R3 leader), so it never gives up.
const (
	// ConnectTimeout bounds the first dial to one server unless ctx has an earlier deadline.
	ConnectTimeout = 2 * time.Second
	// SlowConnectFor is how long Connect tries the first connection again
	// while the server does not answer within the dial's timeout, each
	// dial given twice the last one's (up to MaxConnectTimeout), unless ctx
	// ends first: a process started beside a busy server (a loaded
	// machine, a guest under emulation behind its user-mode network) may
	// need more than one dial's 2 s, and a member that exits takes its
	// sandbox with it. A network that cannot be reached (no route: a link
	// down) is tried again so too, a dial's timeout apart. A refused
	// connection or an authentication error is not tried again.
	SlowConnectFor = 30 * time.Second
	// MaxConnectTimeout bounds one dial of the first connection's tries.
	MaxConnectTimeout = 10 * time.Second
	// ReconnectWait is the pause between reconnect attempts to the same server.
	ReconnectWait = 500 * time.Millisecond
)

// ConnConfig says how to reach the NATS server or cluster and how to authenticate. At most one of
// CredsFile, NKeyFile and Token may be set.
type ConnConfig struct {
	// URL is the server URL, or several separated by commas for a cluster
	// ("nats://a:4222,nats://b:4222"). Required.
	URL string
	// CredsFile is a .creds file (user JWT and nkey seed), as `nsc` writes it.
	CredsFile string
	// NKeyFile is a file holding an nkey user seed.
	NKeyFile string
	// Token is a bare authentication token.
	Token string
	// Name is the connection name the server shows in its monitoring (e.g. "agent.a1").
	Name string
}

// Validate reports every problem of c, joined, each wrapping ErrInvalidConfig and naming the
// field. It does not read the files.
func (c ConnConfig) Validate() error {
	var errs []error
	field := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: ConnConfig."+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if strings.TrimSpace(c.URL) == "" {
		field("URL: required")
	} else {
		for i, u := range strings.Split(c.URL, ",") {
			if err := checkURL(strings.TrimSpace(u)); err != nil {
				field("URL entry %d: %v", i+1, err)
			}
		}
	}
	var auth []string
	for _, a := range [...]struct{ name, value string }{
		{"CredsFile", c.CredsFile}, {"NKeyFile", c.NKeyFile}, {"Token", c.Token},
	} {
		if a.value != "" {
			auth = append(auth, a.name)
		}
	}
	if len(auth) > 1 {
		field("%s: set at most one authentication method", strings.Join(auth, ", "))
	}
	return errors.Join(errs...)
}

// Connect validates cfg and connects to NATS. It reconnects forever with ReconnectWait between
// attempts; opts are applied last and override these defaults (add handlers for disconnect and
// reconnect there). The first connection is tried again while the server does not answer in time,
// each dial waiting twice as long as the last (ConnectTimeout first), until ctx's deadline or for
// SlowConnectFor when it has none, and so is one to a network that cannot be reached; a refused
// connection fails at once. Errors name what failed
// (the config field, the file, or the servers, with credentials in URLs redacted).
func Connect(ctx context.Context, cfg ConnConfig, opts ...nats.Option) (*nats.Conn, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("jetstream: connect to %s: %w", redactURLs(cfg.URL), err)
	}

	all := []nats.Option{
		nats.MaxReconnects(-1),
		nats.ReconnectWait(ReconnectWait),
	}
	if cfg.Name != "" {
		all = append(all, nats.Name(cfg.Name))
	}
	switch {
	case cfg.CredsFile != "":
		if _, err := os.Stat(cfg.CredsFile); err != nil {
			return nil, fmt.Errorf("jetstream: connect: creds file: %w", err)
		}
		all = append(all, nats.UserCredentials(cfg.CredsFile))
		// A member's own credentials let it read only its own inbox.
		prefix, err := CredsInboxPrefix(cfg.CredsFile)
		if err != nil {
			return nil, err
		}
		if prefix != "" {
			all = append(all, nats.CustomInboxPrefix(prefix))
		}
	case cfg.NKeyFile != "":
		opt, err := nats.NkeyOptionFromSeed(cfg.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("jetstream: connect: nkey seed file %s: %w", cfg.NKeyFile, err)
		}
		all = append(all, opt)
	case cfg.Token != "":
		all = append(all, nats.Token(cfg.Token))
	}
	all = append(all, opts...)

	deadline := time.Now().Add(SlowConnectFor)
	if d, ok := ctx.Deadline(); ok {
		deadline = d
	}
	for timeout := ConnectTimeout; ; timeout = min(2*timeout, MaxConnectTimeout) {
		timeout = min(timeout, time.Until(deadline))
		if timeout <= 0 {
			return nil, fmt.Errorf("jetstream: connect to %s: %w", redactURLs(cfg.URL), context.DeadlineExceeded)
		}
		// The dial's timeout first: an option in opts may set it too.
		nc, err := nats.Connect(joinURLs(cfg.URL), append([]nats.Option{nats.Timeout(timeout)}, all...)...)
		if err == nil {
			return nc, nil
		}
		if !(timedOut(err) || unreachable(err)) || ctx.Err() != nil || time.Until(deadline) <= 0 {
			return nil, fmt.Errorf("jetstream: connect to %s: %w", redactURLs(cfg.URL), err)
		}
		if unreachable(err) {
			// Said at once, where a dropped dial takes its timeout: wait
			// that long before the next.
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("jetstream: connect to %s: %w", redactURLs(cfg.URL), err)
			case <-time.After(min(timeout, time.Until(deadline))):
			}
		}
	}
}

// unreachable tells whether a connection failed because no route leads to
// the server now (its node's link is down, say): the network's state, as
// a dial that gets no answer is, not a refusal.
func unreachable(err error) bool {
	return errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, syscall.EHOSTUNREACH)
}

// timedOut tells whether a connection failed for want of an answer in
// time (the dial or the server's greeting), as a slow server's does.
func timedOut(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.Is(err, nats.ErrTimeout) || errors.As(err, &ne) && ne.Timeout()
}

// MemberInboxPrefix returns the inbox prefix of member kind.name of run, _INBOX.<run>.<kind>.<name>,
// below which a member with credentials of its own may subscribe (and nothing else of _INBOX).
func MemberInboxPrefix(run, kind, name string) string {
	return "_INBOX." + run + "." + kind + "." + name
}

// CredsInboxPrefix returns the inbox prefix a .creds file's user must use: MemberInboxPrefix of
// its run and kind tags and its name when the user JWT has both tags (a member's own
// credentials), else "". nats.UserCredentials reads the file again at every connect, so a renewed
// JWT is used after a reconnect; its member does not change.
func CredsInboxPrefix(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("jetstream: creds file: %w", err)
	}
	defer clear(b)
	token, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return "", fmt.Errorf("jetstream: creds file %s: %w", path, err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return "", fmt.Errorf("jetstream: creds file %s: user JWT: %w", path, err)
	}
	tag := func(key string) string {
		for _, t := range uc.Tags {
			if v, ok := strings.CutPrefix(t, key+":"); ok {
				return v
			}
		}
		return ""
	}
	run, kind := tag("run"), tag("kind")
	if run == "" || kind == "" || uc.Name == "" {
		return "", nil
	}
	return MemberInboxPrefix(run, kind, uc.Name), nil
}

// IsNKeySeedFile reports whether the file at path holds a bare nkey user seed (as `stillpoint
// server --auth-dir` writes them, for ConnConfig.NKeyFile) rather than a .creds file (a user JWT
// and its seed, for ConnConfig.CredsFile). It returns an error if the file cannot be read or
// holds neither.
func IsNKeySeedFile(path string) (bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return false, fmt.Errorf("jetstream: credentials file: %w", err)
	}
	defer clear(b)
	if bytes.Contains(b, []byte("-----BEGIN NATS USER JWT-----")) {
		return false, nil
	}
	kp, err := nkeys.ParseDecoratedNKey(b)
	if err != nil {
		return false, fmt.Errorf("jetstream: credentials file %s: neither a .creds file nor an nkey seed: %w", path, err)
	}
	defer kp.Wipe()
	if pub, err := kp.PublicKey(); err != nil || !nkeys.IsValidPublicUserKey(pub) {
		return false, fmt.Errorf("jetstream: credentials file %s: an nkey seed, but not a user's", path)
	}
	return true, nil
}

// checkURL accepts "host:port" and URLs with a scheme that nats.go dials.
func checkURL(s string) error {
	if s == "" {
		return errors.New("empty")
	}
	if !strings.Contains(s, "://") {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%q: %w", redactURL(s), err)
	}
	switch u.Scheme {
	case "nats", "tls", "ws", "wss":
	default:
		return fmt.Errorf("%q: scheme %q, want nats, tls, ws or wss", redactURL(s), u.Scheme)
	}
	if u.Host == "" {
		return fmt.Errorf("%q: no host", redactURL(s))
	}
	return nil
}

// joinURLs trims the entries of a comma-separated URL list.
func joinURLs(list string) string {
	parts := strings.Split(list, ",")
	for i, p := range parts {
		parts[i] = strings.TrimSpace(p)
	}
	return strings.Join(parts, ",")
}

// redactURLs hides user names, passwords and tokens in a comma-separated URL list.
func redactURLs(list string) string {
	parts := strings.Split(list, ",")
	for i, p := range parts {
		parts[i] = redactURL(strings.TrimSpace(p))
	}
	return strings.Join(parts, ",")
}

func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		if at := strings.LastIndex(s, "@"); at >= 0 {
			return "redacted@" + s[at+1:]
		}
		return s
	}
	u.User = url.User("redacted")
	return u.String()
}
