package cli

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
)

func newTimelineCmd(g *globals) *cobra.Command {
	var run, checkpoint string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "timeline",
		Short: "Print a run's phases, acks and outcomes in stream order (a post-mortem)",
		Long: `Read a run's whole conversation back from the STILLPOINT stream, in order, with an
ordered consumer, and print one line per event: time since the first event, stream
sequence, sender and what it said. --checkpoint keeps one checkpoint's (or
operation's) events. docs/POSTMORTEM.md shows the same with the nats CLI.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bus, js, closeBus, err := openBus(cmd.Context(), g, "stillpoint-timeline", 1)
			if err != nil {
				return err
			}
			defer closeBus()
			_ = bus
			entries, err := bridge.ReadTimeline(cmd.Context(), js, run, checkpoint)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(g.stdout)
				for _, e := range entries {
					_ = enc.Encode(e)
				}
				return nil
			}
			var t0 time.Time
			for i, e := range entries {
				if i == 0 {
					t0 = e.Time
				}
				fmt.Fprintf(g.stdout, "%+10.3fs  #%-6d %-28s %s\n", e.Time.Sub(t0).Seconds(), e.StreamSeq, e.Source, e.Summary)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&run, "run", env("STILLPOINT_RUN"), "run id (env STILLPOINT_RUN)")
	cmd.Flags().StringVar(&checkpoint, "checkpoint", "", "keep only this checkpoint's or operation's events")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per event")
	return cmd
}
