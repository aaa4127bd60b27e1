package cli

import (
	"encoding/json"
	"errors"

	"github.com/spf13/cobra"

	"github.com/stillpoint/stillpoint/controller-bridge/inspect"
)

func newInspectCmd(g *globals) *cobra.Command {
	var run string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect",
		Short: "Show what a run keeps on the bus: checkpoints (verified), LATEST, HEAD, snapshots, live members",
		Long: `Read a run's state from the bus, reading only: every checkpoint manifest kept, each of
its member manifests verified against the records object it names (size and sha256
recomputed from the bytes), <run>.LATEST and <run>.HEAD, the snapshots the owner's
index holds for the run and which checkpoints name them, and the live members with
their instances and epochs. --json prints the same as one JSON object. A finished
run's checkpoints (the manifests deleted by its final release) are on the stream:
docs/POSTMORTEM.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if run == "" {
				return &exitError{code: ExitUsage, err: errors.New("inspect: --run is required")}
			}
			conn := g.conn
			if conn.URL == "" {
				conn.URL = "nats://127.0.0.1:4222"
			}
			conn.Name = "stillpoint-inspect"
			nc, js, err := connectJS(cmd.Context(), conn)
			if err != nil {
				return err
			}
			defer nc.Close()
			r, err := inspect.Run(cmd.Context(), js, run)
			if errors.Is(err, inspect.ErrBadRun) {
				return &exitError{code: ExitUsage, err: err}
			}
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(g.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(r)
			}
			return r.WriteText(g.stdout)
		},
	}
	cmd.Flags().StringVar(&run, "run", env("STILLPOINT_RUN"), "run id (env STILLPOINT_RUN)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as one JSON object")
	return cmd
}
