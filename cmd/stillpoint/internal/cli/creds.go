package cli

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/atomicfile"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
)

type credsFlags struct {
	authDir string
	run     string
	member  string
	role    string
	out     string
	ttl     time.Duration
	revoke  string
}

func newCredsCmd(g *globals) *cobra.Command {
	var f credsFlags
	cmd := &cobra.Command{
		Use:   "creds",
		Short: "Mint the NATS credentials of one member (server --auth-dir)",
		Long: `Mint a user of its own for one agent or owner (or sandbox) of a run, with the
keys of a server's --auth-dir (stillpoint server --auth-dir DIR): the
user may ack, heartbeat, write manifests and serve only as that member, in that
run (docs/PERMISSIONS.md). The .creds file goes to --out (mode 0600); give it to
the component with --creds. A run id with credentials of its own is lower case
with no underscore, and an agent's or owner's name has no underscore.

A run is an account of its own. The first creds of a run makes its account
under DIR/runs/RUN, with the credentials of its bridge, controller and admin
(DIR/runs/RUN/<role>.creds) and its owners' sandbox signer; a server on DIR
picks it up within a second and provisions the run's bus in it. --role bridge,
controller or admin with --out writes a copy of that role's credentials instead.

--revoke USER revokes every JWT of a user of --run (its public key, as creds
printed it) issued so far: the auth dir keeps it, a running server on that dir
applies it within seconds (cutting the user off) and a restarted one still
refuses it.`,
		Example: `  stillpoint creds --auth-dir .stillpoint/auth --run train-7 --member agent.a1 --out a1.creds
  stillpoint agent --creds a1.creds --run train-7 --name a1 ...
  stillpoint bridge --creds .stillpoint/auth/runs/train-7/bridge.creds --run train-7 ...
  stillpoint creds --auth-dir .stillpoint/auth --run train-7 --revoke UABC...   # the user key creds printed`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runCreds(g, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.authDir, "auth-dir", "", "the server's --auth-dir (required)")
	fl.StringVar(&f.run, "run", env("STILLPOINT_RUN"), "run id (env STILLPOINT_RUN)")
	fl.StringVar(&f.member, "member", "", "the member, KIND.NAME: agent.a1, owner.o1 (this or --role)")
	fl.StringVar(&f.role, "role", "", "instead of a member: bridge, controller or admin, the run's role credentials")
	fl.StringVar(&f.out, "out", "", "where the .creds file goes (required)")
	fl.DurationVar(&f.ttl, "ttl", 0, "how long the credentials are valid (0: no expiry)")
	fl.StringVar(&f.revoke, "revoke", "", "revoke this user (a public user key) instead of minting")
	return cmd
}

func runCreds(g *globals, f credsFlags) error {
	if f.revoke != "" {
		return runRevoke(g, f)
	}
	if f.authDir == "" || f.run == "" || (f.member == "") == (f.role == "") || f.out == "" {
		return &exitError{code: ExitUsage, err: errors.New("--auth-dir, --run, --out and one of --member and --role are required")}
	}
	auth, err := embedded.LoadAuthority(f.authDir)
	if err != nil {
		return err
	}
	var (
		b    []byte
		user string
		what = f.member
	)
	if f.role != "" {
		what = "role " + f.role
		if err = auth.AddRun(f.run); err == nil {
			b, err = auth.RoleCreds(embedded.Role(f.role), f.run)
		}
	} else {
		b, user, err = auth.MemberCreds(f.run, events.Member(f.member), f.ttl)
	}
	if err != nil {
		if errors.Is(err, embedded.ErrNotMember) || errors.Is(err, embedded.ErrInvalidConfig) {
			return &exitError{code: ExitUsage, err: err}
		}
		return err
	}
	defer clear(b)
	if err := atomicfile.Write(f.out, b, 0o600); err != nil {
		return fmt.Errorf("creds: %w", err)
	}
	if user != "" {
		user = " (user " + user + ")"
	}
	fmt.Fprintf(g.stdout, "stillpoint: credentials of %s in run %s%s in %s; the run's account is in %s\n",
		what, f.run, user, f.out, embedded.RunDir(f.authDir, f.run))
	return nil
}

// runRevoke is creds --revoke: the revocation goes into the run's account JWT
// (Authority.Revoke), which a running server on the dir watches.
func runRevoke(g *globals, f credsFlags) error {
	if f.authDir == "" || f.run == "" || f.member != "" || f.role != "" || f.out != "" {
		return &exitError{code: ExitUsage, err: errors.New("--revoke takes --auth-dir and --run only")}
	}
	auth, err := embedded.LoadAuthority(f.authDir)
	if err != nil {
		return err
	}
	if err := auth.Revoke(f.run, f.revoke); err != nil {
		if errors.Is(err, embedded.ErrInvalidConfig) || errors.Is(err, embedded.ErrNoRun) {
			return &exitError{code: ExitUsage, err: err}
		}
		return err
	}
	fmt.Fprintf(g.stdout, "stillpoint: user %s of run %s revoked in %s; a server on that dir refuses it from now on\n",
		f.revoke, f.run, embedded.AccountJWTFile(embedded.RunDir(f.authDir, f.run)))
	return nil
}
