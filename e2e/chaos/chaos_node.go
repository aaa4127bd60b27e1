package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/cmd/stillpoint/demo"
	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/events"
)

// The faults of a node lost for a while (issue 28; PROTOCOL §5, Progress
// only moves forward).
const (
	// FaultNode kills (SIGKILL) one node's agent and owner at a point and
	// stops the sandboxes that owner lent (the owner's reap: a node's
	// death takes its sandboxes with it). They stay down until a
	// checkpoint has committed without them, or nodeDownMax has passed,
	// and are then started again, fresh processes of the same names:
	// meanwhile the checkpoints carry the node's rollouts and the other
	// nodes' go on.
	FaultNode = "node"
	// FaultPreempt sends SIGTERM to the round's collector, then a process
	// of its own, while a node is down: the collector takes a checkpoint
	// with stop, which commits without the dead node and carries its
	// rollouts, and exits collect.ExitStopped. Then the job comes back on
	// its nodes: every agent and owner is started again, the dead node's
	// and the others' (a stop leaves the members that committed it parked,
	// with no resume: PROTOCOL §5), and the collector is run again on its
	// results and dispatch log; it restores the stop checkpoint, carried
	// rollouts and all, into the fresh fleet. It follows a node fault in
	// its round: drawn, one is drawn before it; in --plan, node@<point>
	// comes first (node@committed+preempt@prepare).
	FaultPreempt = "preempt"
)

// nodeDownMax bounds how long a node fault keeps its node down when no
// checkpoint commits without it: the dead members' heartbeats live 30 s,
// and the checkpoints fail until they are gone.
const nodeDownMax = time.Minute

// preemptWait bounds how long a preempted collector takes to exit: the
// checkpoint open at the SIGTERM, then the checkpoint with stop, each of
// which may wait out the dead members' heartbeats.
const preemptWait = 3 * time.Minute

// nodeFaultsNeed is the fewest agents (nodes) a node or preempt fault
// needs: with one, the node is the whole fleet, and no checkpoint can
// commit without it.
const nodeFaultsNeed = 2

// nextKind returns the kind of the fault after plan[k] that the injector
// runs (the bridge's aside), "" when none follows.
func nextKind(plan []plannedFault, k int) string {
	for _, p := range plan[k+1:] {
		if p.kind != FaultBridge {
			return p.kind
		}
	}
	return ""
}

// checkPreempts says which preempt of a round follows no node fault.
func checkPreempts(round []plannedFault) error {
	prev := ""
	for _, p := range round {
		if p.kind == FaultBridge {
			continue
		}
		if p.kind == FaultPreempt && prev != FaultNode {
			return fmt.Errorf("%s follows no node fault: a preempt takes the collector down while a node is down (node@committed+preempt@prepare)", p)
		}
		prev = p.kind
	}
	return nil
}

// withNodes puts a node fault before every preempt of a drawn round that
// follows none, drawn as the others are (draw).
func withNodes(plan []plannedFault, draw func() plannedFault) []plannedFault {
	out := make([]plannedFault, 0, len(plan))
	for _, p := range plan {
		if p.kind == FaultPreempt && (len(out) == 0 || out[len(out)-1].kind != FaultNode) {
			n := draw()
			n.kind = FaultNode
			out = append(out, n)
		}
		out = append(out, p)
	}
	return out
}

// nodeFault is what inject does for FaultNode. With keepDown (a preempt
// follows) it leaves the node down for the preempt to start again;
// otherwise it waits for a checkpoint to commit without the node, up to
// nodeDownMax, and for --node-down to pass, and starts it again.
func (i *injector) nodeFault(ctx context.Context, p plannedFault, keepDown bool) error {
	d := i.d
	busy := busyNodes(d.Dir(), i.agents)
	if len(busy) == 0 {
		return errNoBusyNode
	}
	a := busy[i.rng.IntN(len(busy))]
	o := demo.NodeOwner(a)
	without, stop, err := i.commitsWithout(events.Member("agent."+a), events.Member("owner."+o))
	if err != nil {
		return err
	}
	defer stop()
	d.Say("kill -9 of node %s (agent %s, owner %s) at %s", a, a, o, p.phase)
	if err := d.Kill9(ctx, "agent-"+a, demo.OwnerProc(o)); err != nil {
		return err
	}
	gone := d.ReapOwner(ctx, o)
	d.Say("node %s: %d sandboxes of owner %s stopped with it", a, len(gone), o)
	if keepDown {
		i.mu.Lock()
		i.down = a
		i.mu.Unlock()
		return nil
	}
	began := time.Now()
	least := i.w.f.nodeDown
	limit := time.NewTimer(max(nodeDownMax, least))
	defer limit.Stop()
	why := ""
	select {
	case <-ctx.Done():
		return nil // the round is over
	case <-limit.C:
		why = fmt.Sprintf("no checkpoint committed without it in %s", max(nodeDownMax, least))
	case id := <-without:
		why = "checkpoint " + id + " committed without it"
	}
	if rest := least - time.Since(began); rest > 0 {
		d.Say("node %s: %s; down %s more (--node-down %s)", a, why, rest.Round(time.Second), least)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(rest):
		}
	}
	d.Say("node %s started again after %s down: %s", a, time.Since(began).Round(time.Second), why)
	return d.StartNode(ctx, i.bus, a, i.modelURL)
}

// errNoBusyNode: a node fault found no node with a rollout unfinished.
var errNoBusyNode = errors.New("no node holds an unfinished rollout")

// busyNodes returns the agents that hold a rollout the collector sent them
// and has no result of, per its dispatch log and results file. A node
// fault takes one of them down: the collection cannot end while it is
// down, as its final release would wait for the dead members and fail.
func busyNodes(dir string, agents []string) []string {
	results := filepath.Join(dir, "results.jsonl")
	done := map[string]bool{}
	for _, r := range jsonLines[collect.Result](results) {
		done[r.RolloutID] = true
	}
	on := map[string]string{} // rollout -> agent of its last dispatch
	for _, e := range jsonLines[struct {
		RolloutID string `json:"rollout_id"`
		Agent     string `json:"agent"`
	}](results + ".dispatch") {
		on[e.RolloutID] = e.Agent
	}
	var busy []string
	for _, a := range agents {
		for id, at := range on {
			if at == a && !done[id] {
				busy = append(busy, a)
				break
			}
		}
	}
	return busy
}

// jsonLines decodes the lines of a JSONL file, skipping those that do
// not decode (one being written); none when there is no file.
func jsonLines[T any](path string) []T {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []T
	for line := range bytes.SplitSeq(b, []byte{'\n'}) {
		var v T
		if json.Unmarshal(line, &v) == nil {
			out = append(out, v)
		}
	}
	return out
}

// commitsWithout watches the run's checkpoint.committed outcomes from now
// on and sends the id of each whose members name none of gone, until the
// returned stop.
func (i *injector) commitsWithout(gone ...events.Member) (<-chan string, func(), error) {
	ids := make(chan string, 16)
	sub, err := i.nc.Subscribe(events.OutcomeSubject(i.d.RunID(), events.TypeCheckpointCommitted), func(m *nats.Msg) {
		_, data, err := events.Unmarshal(m)
		if err != nil {
			return
		}
		c, ok := data.(events.CheckpointCommitted)
		if !ok || slices.ContainsFunc(c.Members, func(m events.Member) bool { return slices.Contains(gone, m) }) {
			return
		}
		select {
		case ids <- c.CheckpointID:
		default:
		}
	})
	if err != nil {
		return nil, nil, fmt.Errorf("watch the committed checkpoints: %w", err)
	}
	return ids, func() { _ = sub.Unsubscribe() }, nil
}

// errNoNodeDown: a preempt whose node fault did not land.
var errNoNodeDown = errors.New("no node is down")

// preempt is what inject does for FaultPreempt: SIGTERM to the collector
// while the node fault before it keeps its node down; once the collector
// has stopped after its checkpoint, the job comes back on its nodes (every
// agent and owner a fresh process, the parked ones killed first) and the
// collector is run again.
func (i *injector) preempt(ctx context.Context, p plannedFault) error {
	if i.collector == nil {
		return errNoCollector
	}
	i.mu.Lock()
	a := i.down
	i.mu.Unlock()
	if a == "" {
		return errNoNodeDown
	}
	d := i.d
	d.Say("SIGTERM to the collector at %s, node %s down: a checkpoint with stop, then the rerun", p.phase, a)
	return i.collector.preempt(ctx, func(ctx context.Context) error {
		i.mu.Lock()
		i.down = ""
		i.mu.Unlock()
		d.Say("the job comes back on its nodes: every agent and owner started again, node %s's with them", a)
		if err := d.Kill9(ctx, d.FleetProcs(i.agents)...); err != nil {
			return err
		}
		for _, ag := range i.agents {
			if err := d.StartNode(ctx, i.bus, ag, i.modelURL); err != nil {
				return err
			}
		}
		return nil
	})
}

// startDown starts the node a node fault left down again, if any.
func (i *injector) startDown(ctx context.Context) error {
	i.mu.Lock()
	a := i.down
	i.down = ""
	i.mu.Unlock()
	if a == "" {
		return nil
	}
	return i.d.StartNode(ctx, i.bus, a, i.modelURL)
}

// preempt sends the collector SIGTERM and waits for it to exit stopped
// (collect.ExitStopped: its checkpoint with stop committed); then it calls
// back (the node comes back) and starts the collector again on the same
// results and dispatch log. A collector that exits otherwise is not
// started again: wait reports how it ended.
func (c *collectorProcess) preempt(ctx context.Context, back func(context.Context) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.d.Process("collector")
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, preemptWait)
	defer cancel()
	exit, err := p.Wait(wctx)
	if err != nil {
		return fmt.Errorf("the collector did not exit within %s of its SIGTERM: %w", preemptWait, err)
	}
	if exit.Code != collect.ExitStopped {
		return fmt.Errorf("the collector exited %s after its SIGTERM, not %d (stopped after a committed checkpoint): %s",
			exit, collect.ExitStopped, lastLine(p.Output()))
	}
	berr := back(ctx)
	return errors.Join(berr, c.spawn())
}
