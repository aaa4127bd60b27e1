package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/cmd/stillpoint/demo"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// injector injects a round's faults.
type injector struct {
	w         *chaosWorld
	d         *demo.Fleet
	bus       *jetstream.Bus
	nc        *nats.Conn
	agents    []string
	ids       []string // the round's rollouts
	modelURL  string
	rng       *rand.Rand        // whom a fault hits; used by run, and by a held network fault before it is in place
	collector *collectorProcess // the round's collector, when a fault kills it

	mu          sync.Mutex
	injected    map[string]int
	missed      map[string]int
	missedNames []string // the faults that missed, kind@point
	down        string   // the agent of the node a node fault left down for a preempt

	// applied, when set, is called by a network fault once it is in place
	// (run: the faults after it land while it holds).
	applied func()
}

func (i *injector) count(kind string, hit bool) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if hit {
		i.injected[kind]++
	} else {
		i.missed[kind]++
	}
}

// miss counts fault p missed.
func (i *injector) miss(p plannedFault) {
	i.count(p.kind, false)
	i.mu.Lock()
	i.missedNames = append(i.missedNames, p.String())
	i.mu.Unlock()
}

// bridgeWatch starts the bridge again each time it exits on its own (an
// armed failpoint) until ctx ends; with armed, the first bridge was armed,
// and its exit is the fault; it reports it missed if the round ended first.
func (i *injector) bridgeWatch(ctx context.Context, armed bool, failpoint string) {
	for {
		p := i.d.Process("bridge")
		select {
		case <-ctx.Done():
			if armed {
				i.miss(plannedFault{kind: FaultBridge, failpoint: failpoint})
			}
			return
		case <-p.Exited():
		}
		if armed {
			i.count(FaultBridge, true)
			armed = false
		}
		i.d.Say("the bridge exited (%s); starting it again", strings.TrimSpace(lastLine(p.Output())))
		for {
			if _, err := i.d.StartBridge(ctx); err == nil || ctx.Err() != nil {
				break
			}
		}
	}
}

// lastLine returns the last line of s.
func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if j := strings.LastIndexByte(s, '\n'); j >= 0 {
		return s[j+1:]
	}
	return s
}

// run injects the planned faults other than the bridge's, one after the
// other: each after its delay, at the next phase of its kind on the bus.
// A network fault holds while the faults after it land (a fleet killed
// while a node is cut off: its sandboxes' daemons, which outlive their
// owner, are members of the epoch before the restore), and heals before
// run returns.
func (i *injector) run(ctx context.Context, plan []plannedFault, done func() int) {
	phases := make(chan events.Phase, 64)
	sub, err := i.nc.Subscribe(events.RunFilter(i.d.RunID()), func(m *nats.Msg) {
		p := point(i.d.RunID(), m.Subject)
		if p == "" {
			return
		}
		select {
		case phases <- p:
		default:
		}
	})
	if err != nil {
		i.d.Say("phase subscription: %v", err)
		return
	}
	defer func() { _ = sub.Unsubscribe() }()
	var holds sync.WaitGroup
	defer holds.Wait()
	for k, p := range plan {
		if p.kind == FaultBridge {
			continue
		}
		next := nextKind(plan, k)
		if isNetFault(p.kind) && next != "" {
			applied := make(chan struct{})
			var once sync.Once
			i.applied = func() { once.Do(func() { close(applied) }) }
			holds.Go(func() {
				defer i.applied()
				i.one(ctx, p, next, phases, done)
			})
			<-applied // in place, or missed
			continue
		}
		i.one(ctx, p, next, phases, done)
		if next != FaultPreempt && ctx.Err() == nil {
			// A node left down for the preempt comes back once the
			// preempt is done, landed or not: the round cannot finish
			// without it.
			if err := i.startDown(ctx); err != nil {
				i.d.Say("starting the node left down again: %v", err)
			}
		}
	}
}

// one injects fault p after its delay, at the next phase of its kind on
// the bus, and counts it injected or missed; next is the kind of the
// fault that follows.
func (i *injector) one(ctx context.Context, p plannedFault, next string, phases chan events.Phase, done func() int) {
	select {
	case <-ctx.Done():
		i.miss(p)
		return
	case <-time.After(p.after):
	}
	// Phases seen before the delay ended do not count.
drain:
	for {
		select {
		case <-phases:
		default:
			break drain
		}
	}
	hit := false
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case ph := <-phases:
			if ph == p.phase {
				hit = true
				break wait
			}
		}
	}
	if !hit || done() >= len(i.ids) {
		i.miss(p)
		return
	}
	if err := i.inject(ctx, p, next, phases); err != nil {
		i.d.Say("%s: %v", p, err)
		i.miss(p)
		return
	}
	i.count(p.kind, true)
}

// inject injects one fault now; next is the kind of the fault that
// follows it, "" when none does; a stall reads the points that follow
// from phases.
func (i *injector) inject(ctx context.Context, p plannedFault, next string, phases <-chan events.Phase) error {
	d := i.d
	switch p.kind {
	case FaultStall:
		a := i.agents[i.rng.IntN(len(i.agents))]
		proc := d.Process("agent-" + a)
		d.Say("SIGSTOP of agent %s at %s, until a checkpoint fails", a, p.phase)
		if err := proc.Signal(syscall.SIGSTOP); err != nil {
			return err
		}
		defer func() {
			d.Say("SIGCONT of agent %s", a)
			_ = proc.Signal(syscall.SIGCONT)
		}()
		limit := time.NewTimer(stallLimit)
		defer limit.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-limit.C:
				return nil
			case ph := <-phases:
				if ph == pointFailed {
					return nil
				}
			}
		}
	case FaultAgent:
		a := i.agents[i.rng.IntN(len(i.agents))]
		d.Say("kill -9 of agent %s at %s", a, p.phase)
		if err := d.Kill9(ctx, "agent-"+a); err != nil {
			return err
		}
		return d.StartAgent(ctx, i.bus, a, i.modelURL)
	case FaultOwner:
		o := demo.NodeOwner(i.agents[i.rng.IntN(len(i.agents))])
		d.Say("kill -9 of owner %s at %s", o, p.phase)
		if err := d.Kill9(ctx, demo.OwnerProc(o)); err != nil {
			return err
		}
		return d.StartOwner(ctx, i.bus, o)
	case FaultFleet:
		d.Say("kill -9 of the owners and the agents at %s", p.phase)
		if err := d.Kill9(ctx, d.FleetProcs(i.agents)...); err != nil {
			return err
		}
		for _, a := range i.agents {
			if err := d.StartNode(ctx, i.bus, a, i.modelURL); err != nil {
				return err
			}
		}
		return nil
	case FaultNode:
		return i.nodeFault(ctx, p, next == FaultPreempt)
	case FaultPreempt:
		return i.preempt(ctx, p)
	case FaultSandboxd, FaultHarness:
		pids, err := sandboxTargets(ctx, d.RunID(), p)
		if err != nil {
			return err
		}
		pid := pids[i.rng.IntN(len(pids))]
		d.Say("kill -9 of %s process %d at %s", p.kind, pid, p.phase)
		return killPID(pid)
	case FaultCollector:
		return i.collectorKill(ctx, p)
	case FaultPartition, FaultOneWay, FaultSplit, FaultSlow, FaultLossy:
		return i.netFault(ctx, p)
	case FaultNATS:
		if i.w.cluster() {
			return errors.New("nats is a fault of one server; with --cluster, nats-node")
		}
		d.Say("kill -9 of the NATS server at %s, started again on its store", p.phase)
		return i.w.restartNATS(ctx)
	case FaultNATSNode:
		if !i.w.cluster() {
			return errors.New("nats-node is a fault of --cluster")
		}
		n := i.rng.IntN(len(i.w.nodes))
		d.Say("kill -9 of NATS node %s at %s", i.w.nodes[n].name, p.phase)
		if err := i.w.killNode(ctx, n); err != nil {
			return err
		}
		down := time.NewTimer(nodeDownFor)
		defer down.Stop()
	wait:
		for {
			select {
			case <-ctx.Done():
				break wait
			case <-down.C:
				break wait
			case ph := <-phases:
				if ph == pointCommitted || ph == pointFailed {
					break wait
				}
			}
		}
		d.Say("NATS node %s started again on its store", i.w.nodes[n].name)
		return i.w.startNode(context.WithoutCancel(ctx), n)
	}
	return fmt.Errorf("unknown fault kind %q", p.kind)
}
