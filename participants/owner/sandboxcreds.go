package owner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/internal/atomicfile"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// DefaultSandboxCredsTTL is how long a sandbox's user is valid when
// SandboxCreds.TTL is 0; it is renewed every third of it.
const DefaultSandboxCredsTTL = 10 * time.Minute

// credsDirInSandbox is where a sandbox sees its own credentials directory,
// relative to its root; the daemon's creds file is nats.creds in it.
const credsDirInSandbox = "etc/stillpoint/creds"

// Minter mints the credentials (a .creds file) of member sandbox.<name> of
// run, valid from now for ttl, and returns them with the user's public key.
// embedded.Signer, holding the sandbox kind's scoped signing key, is one.
type Minter interface {
	Mint(run, name string, ttl time.Duration, now time.Time) (creds []byte, user string, err error)
}

// SandboxCreds gives every sandbox a NATS user of its own, minted by Minter
// with a short expiry, and renews it while the sandbox lives (Renew): the
// credentials a sandbox's workload can read let it speak only as that
// sandbox, and only until shortly after it is gone (docs/PERMISSIONS.md).
// Each sandbox's file is Dir/<id>/nats.creds on the host, shown read-only
// in the sandbox; the daemon reads it again at every reconnect.
type SandboxCreds struct {
	// Minter mints the users. Required.
	Minter Minter
	// Run is the run id. Required.
	Run string
	// Dir holds a directory per sandbox on the host. Required.
	Dir string
	// TTL is each user's validity (default DefaultSandboxCredsTTL).
	TTL time.Duration

	mu     sync.Mutex
	failed map[string]error // sandboxes whose credentials could not be written, for Renew to log
}

func (c *SandboxCreds) ttl() time.Duration {
	if c.TTL > 0 {
		return c.TTL
	}
	return DefaultSandboxCredsTTL
}

// Check mints one user and throws it away: a run or minter that cannot
// make sandboxes' users fails here, before any sandbox starts.
func (c *SandboxCreds) Check() error {
	if c.Minter == nil || c.Run == "" || c.Dir == "" {
		return fmt.Errorf("%w: SandboxCreds: Minter, Run and Dir required", ErrInvalidConfig)
	}
	b, _, err := c.Minter.Mint(c.Run, "check", c.ttl(), time.Now())
	clear(b)
	if err != nil {
		return fmt.Errorf("owner: sandbox credentials: %w", err)
	}
	return os.MkdirAll(c.Dir, 0o700)
}

// issue writes fresh credentials of sandbox id to Dir/<id>/nats.creds and,
// when root is set (a provider whose sandbox got a copy of the directory
// rather than a view of it), into the sandbox's copy too.
func (c *SandboxCreds) issue(id, root string, now time.Time) error {
	b, _, err := c.Minter.Mint(c.Run, id, c.ttl(), now)
	if err != nil {
		return fmt.Errorf("owner: credentials of sandbox %s: %w", id, err)
	}
	defer clear(b)
	dir := filepath.Join(c.Dir, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("owner: credentials of sandbox %s: %w", id, err)
	}
	if err := atomicfile.Write(filepath.Join(dir, "nats.creds"), b, 0o644); err != nil {
		return fmt.Errorf("owner: credentials of sandbox %s: %w", id, err)
	}
	if root != "" {
		if err := atomicfile.Write(filepath.Join(root, credsDirInSandbox, "nats.creds"), b, 0o644); err != nil {
			return fmt.Errorf("owner: credentials of sandbox %s, its copy: %w", id, err)
		}
	}
	return nil
}

// spec writes the first credentials of the sandbox spec starts and shows
// them in it; an error is kept for Renew, which logs it and tries again.
func (c *SandboxCreds) spec(spec *provider.Spec) string {
	if err := c.issue(spec.ID, "", time.Now()); err != nil {
		c.mu.Lock()
		if c.failed == nil {
			c.failed = map[string]error{}
		}
		c.failed[spec.ID] = err
		c.mu.Unlock()
	}
	spec.Binds = append(spec.Binds, provider.Bind{HostDir: filepath.Join(c.Dir, spec.ID), SandboxDir: credsDirInSandbox})
	return "/" + credsDirInSandbox + "/nats.creds"
}

// Renew renews the credentials of every live sandbox, every third of TTL,
// until ctx ends, and removes those of sandboxes that are gone. live
// returns the live sandboxes.
func (c *SandboxCreds) Renew(ctx context.Context, log zerolog.Logger, live func() []*provider.Sandbox) {
	t := time.NewTicker(max(c.ttl()/3, time.Second))
	defer t.Stop()
	for {
		c.mu.Lock()
		failed := c.failed
		c.failed = nil
		c.mu.Unlock()
		for id, err := range failed {
			log.Error().Err(err).Str("sandbox", id).Msg("sandbox credentials not written; retrying")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.renewOnce(log, live(), time.Now())
	}
}

func (c *SandboxCreds) renewOnce(log zerolog.Logger, live []*provider.Sandbox, now time.Time) {
	keep := map[string]bool{}
	for _, sb := range live {
		keep[sb.ID] = true
		root := ""
		if sb.ProcRoot != "/" {
			root = sb.Root // no mount namespace: the sandbox got a copy
		}
		if err := c.issue(sb.ID, root, now); err != nil {
			log.Error().Err(err).Str("sandbox", sb.ID).Msg("sandbox credentials not renewed")
		}
	}
	entries, err := os.ReadDir(c.Dir)
	if err != nil {
		log.Warn().Err(err).Msg("sandbox credentials directory")
		return
	}
	for _, e := range entries {
		// A sandbox being started is not live yet: only credentials that
		// expired are of a sandbox that is gone.
		if st, err := os.Stat(filepath.Join(c.Dir, e.Name(), "nats.creds")); e.IsDir() && !keep[e.Name()] && (err != nil || now.Sub(st.ModTime()) > c.ttl()) {
			if err := os.RemoveAll(filepath.Join(c.Dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				log.Warn().Err(err).Str("sandbox", e.Name()).Msg("remove the credentials of a gone sandbox")
			}
		}
	}
}
