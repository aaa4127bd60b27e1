package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/attack"
)

// attackFlags are the flags of `stillpoint attack`.
type attackFlags struct {
	run     string
	member  string
	victims []string
	only    []string
	every   time.Duration
	rounds  int
}

func newAttackCmd(g *globals) *cobra.Command {
	var f attackFlags
	cmd := &cobra.Command{
		Use:   "attack",
		Short: "Attack the bus with the credentials a hostile workload can read (issue 29's list)",
		Long: `Connect with --creds (a sandbox's, an agent's or an owner's, as a workload that read
them would) and try, once a round, every attack of docs/PERMISSIONS.md's list:
dedupe (publish other members' predictable message ids first), consumer-update
(re-configure the --victims' durable consumers), durables (make durable
consumers), rollup (purge the heartbeats bucket through one's own heartbeat key,
and an owner the snapshot index through one of its keys),
metadata (list every subject of the stream) and flood (16 MiB on one's own ack
subjects). Each outcome is one JSON line: refused, or what got through, which the
run must show harmless (its checkpoints keep committing, other runs see nothing).
It runs --rounds rounds (0: until interrupted), --every apart.`,
		Example: `  stillpoint attack --creds /var/lib/stillpoint/creds/sb-1/nats.creds --run r1 --member sandbox.sb-1 \
      --victims agent.a1,owner.o1 --every 2s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runAttack(cmd.Context(), g, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.run, "run", env("STILLPOINT_RUN"), "the run the credentials belong to (env STILLPOINT_RUN)")
	fl.StringVar(&f.member, "member", "", "the member the credentials are, KIND.NAME (required)")
	fl.StringSliceVar(&f.victims, "victims", nil, "members whose names the attacks borrow, KIND.NAME,...")
	fl.StringSliceVar(&f.only, "only", nil, "run only these attacks (default all): "+strings.Join(attack.Names, ","))
	fl.DurationVar(&f.every, "every", time.Second, "pause between rounds")
	fl.IntVar(&f.rounds, "rounds", 1, "rounds to run (0: until interrupted)")
	return cmd
}

func runAttack(ctx context.Context, g *globals, f attackFlags) error {
	if f.run == "" || f.member == "" {
		return &exitError{code: ExitUsage, err: errors.New("--run and --member are required")}
	}
	t := attack.Target{Run: f.run, Self: events.Member(f.member)}
	if err := t.Self.Validate(); err != nil {
		return &exitError{code: ExitUsage, err: fmt.Errorf("--member: %w", err)}
	}
	for _, v := range f.victims {
		m := events.Member(v)
		if err := m.Validate(); err != nil {
			return &exitError{code: ExitUsage, err: fmt.Errorf("--victims: %w", err)}
		}
		t.Victims = append(t.Victims, m)
	}
	names := attack.Names
	if len(f.only) > 0 {
		for _, n := range f.only {
			if !strings.Contains(","+strings.Join(attack.Names, ",")+",", ","+n+",") {
				return &exitError{code: ExitUsage, err: fmt.Errorf("--only: no attack %q (have %s)", n, strings.Join(attack.Names, ", "))}
			}
		}
		names = f.only
	}
	conn := g.conn
	conn.Name = "stillpoint-attack"
	a, err := attack.Connect(ctx, conn, t)
	if err != nil {
		return err
	}
	defer a.Close()
	enc := json.NewEncoder(g.stdout)
	round := 0
	return poll.Until(ctx, poll.Every(f.every), func() (bool, error) {
		if ctx.Err() != nil {
			return true, nil // stopped: no round after the end
		}
		round++
		for _, n := range names {
			o := a.Run(ctx, n)
			if ctx.Err() != nil {
				return true, nil
			}
			if err := enc.Encode(struct {
				Round int `json:"round"`
				attack.Outcome
			}{round, o}); err != nil {
				return false, err
			}
		}
		return round == f.rounds, nil
	})
}
