// Package metrics is the Prometheus side of a Stillpoint process: one
// registry per process with the project's metric families, and the small
// HTTP server that serves them beside two health endpoints.
//
// A component takes a *Set in its Config; nil turns its metrics off, and
// every method of Set is a no-op on a nil receiver, so that a hook is one
// line where the component already logs the event:
//
//	b.cfg.Metrics.Outcome("checkpoint.committed", metrics.ReasonNone)
//
// Each process makes one Set (New) and hands it to the components it runs;
// nothing is registered on client_golang's global default registry, so
// that tests that run several components in one process do not collide.
//
// Families (docs/OPERATIONS.md lists them with their labels and PromQL
// examples). Every label has a bounded set of values: a phase, a member
// kind, a result, a pause mode, a reason code, a provider name; never a
// checkpoint id, a rollout or a member name.
//
//	stillpoint_phase_duration_seconds{phase}            bridge
//	stillpoint_outcomes_total{outcome,reason}           bridge
//	stillpoint_acks_total{phase,kind,result}            bridge
//	stillpoint_relay_held_calls_total                   bridge (from sandbox daemons' resume acks)
//	stillpoint_pauses_total{mode}                       agent
//	stillpoint_pause_duration_seconds{mode}             agent
//	stillpoint_relaunch_fallbacks_total{reason}         agent
//	stillpoint_rebinds_total{outcome}                   agent
//	stillpoint_snapshot_duration_seconds{provider}      owner
//	stillpoint_snapshot_bytes{provider}                 owner
//	stillpoint_fork_duration_seconds{provider}          owner
//	stillpoint_fork_bytes{provider}                     owner
//	stillpoint_rollout_results_total{result}            collector
//	stillpoint_continuations_total{how}                 collector
//
// Health: Handler serves /metrics, /healthz (the process is up: always
// 200) and /readyz (200 once every Probe passes: connected to NATS, the
// member's consumer there; else 503 with the first failure). The bridge
// mounts the same three routes on its API server; the agent, owner and
// collector serve them on --metrics-addr with Serve.
package metrics
