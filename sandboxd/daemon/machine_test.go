package daemon

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/internal/golden"
	"github.com/stillpoint/stillpoint/sandboxd"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// The golden scripts in testdata/*.txt drive a Machine as the daemon's
// driver would, in the form of the bridge machine's scripts: a list of
// inputs, one a line, each followed by the effects the machine answered
// with, indented by two spaces. Lines starting with # are comments. The
// harness keeps a small world (the supervisor's launches, whether the
// relay holds and its capture is durable, the jobs the machine started)
// that the effects change and the inputs read. go test -update rewrites
// the indented lines with what the machine does now: read the diff before
// committing it.
var update = flag.Bool("update", false, "rewrite the expected effects of testdata/*.txt")

func TestMachineScripts(t *testing.T) {
	golden.RunAll(t, *update, func(t *testing.T) func(string) []string {
		s := &script{t: t, m: NewMachine(false, nil), launches: map[string]sandboxapi.State{}, durable: true,
			pauses: map[string]StartPause{}, stops: map[string]StopLaunch{}, watches: map[string]uint64{}, seqs: map[string]int{}}
		return s.do
	})
}

// script is the world a Machine's driver sees, kept from script lines.
type script struct {
	t *testing.T
	m *Machine

	launches map[string]sandboxapi.State // the supervisor's
	seqs     map[string]int              // each launch's pause sequence
	holding  bool                        // the relay's hold
	durable  bool                        // the relay's capture

	pauses  map[string]StartPause // launch -> its last pause started
	stops   map[string]StopLaunch
	watches map[string]uint64
	flush   uint64
}

// args are a line's words: flags and key=value pairs.
type args struct {
	pos  []string
	kv   map[string]string
	flag map[string]bool
}

func parse(words []string) args {
	a := args{kv: map[string]string{}, flag: map[string]bool{}}
	for _, w := range words {
		if k, v, ok := strings.Cut(w, "="); ok {
			a.kv[k] = v
		} else {
			a.pos = append(a.pos, w)
			a.flag[w] = true
		}
	}
	return a
}

func (a args) num(k string, def int) int {
	if v, ok := a.kv[k]; ok {
		n, _ := strconv.Atoi(v)
		return n
	}
	return def
}

// cp is a checkpoint argument: "-" is "" (every checkpoint).
func cp(s string) string {
	if s == "-" {
		return ""
	}
	return s
}

var states = map[string]sandboxapi.State{"running": sandboxapi.StateRunning, "paused": sandboxapi.StatePaused,
	"stopping": sandboxapi.StateStopping, "ended": sandboxapi.StateEnded}

var verdicts = map[string]sandboxapi.Verdict{"held": sandboxapi.VerdictHeld, "ended": sandboxapi.VerdictEnded,
	"identity_changed": sandboxapi.VerdictIdentityChanged, "not_holding": sandboxapi.VerdictNotHolding,
	"unknown_launch": sandboxapi.VerdictUnknownLaunch}

// do runs one line and returns what the machine did, printed.
func (s *script) do(line string) []string {
	words := strings.Fields(line)
	cmd, a := words[0], parse(words[1:])
	switch cmd {
	case "machine":
		eps := map[string]string{}
		for _, kv := range strings.Split(a.kv["episodes"], ",") {
			if l, ep, ok := strings.Cut(kv, ":"); ok {
				eps[l] = ep
			}
		}
		s.m = NewMachine(a.flag["relay"], eps)
		return nil
	case "launches":
		for id, st := range a.kv {
			state, ok := states[st]
			if !ok {
				s.t.Fatalf("%s: unknown state %q", line, st)
			}
			s.launches[id] = state
		}
		return nil
	case "restore-hold":
		s.holding = true
		return nil
	case "capture":
		s.durable = a.flag["synced"]
		return nil
	case "open?":
		return []string{fmt.Sprintf("open %q", s.m.Open())}
	case "mark?":
		return []string{fmt.Sprintf("mark %q", s.m.Mark(a.pos[0]))}
	case "pausing?":
		return []string{fmt.Sprintf("pausing %v", s.m.Pausing(a.pos[0]))}
	case "episode?":
		return []string{fmt.Sprintf("episode %q", s.m.Episode(a.pos[0]))}
	case "holding?":
		return []string{fmt.Sprintf("holding %v", s.holding)}
	}
	effs, err := s.m.Step(s.input(cmd, a, line))
	out := make([]string, 0, len(effs)+1)
	for _, e := range effs {
		s.observe(e)
		out = append(out, show(e))
	}
	if err != nil {
		out = append(out, "error: "+err.Error())
	}
	return out
}

// observe changes the world as the driver carrying out e would.
func (s *script) observe(e Effect) {
	switch e := e.(type) {
	case RelayHold:
		s.holding = true
	case RelayRelease, RelayDrop:
		s.holding = false
	case StartPause:
		s.pauses[e.Launch] = e
	case StopLaunch:
		s.stops[e.Launch] = e
		s.launches[e.Launch] = sandboxapi.StateStopping
	case WatchEnd:
		s.watches[e.Launch] = e.Job
	case Flush:
		s.flush = e.Job
	}
}

// input turns a line into the machine's input.
func (s *script) input(cmd string, a args, line string) Input {
	var id string
	if len(a.pos) > 0 {
		id = a.pos[0]
	}
	switch cmd {
	case "prepare":
		in := PrepareAsked{Checkpoint: id, Holding: s.holding, Durable: s.durable}
		for _, l := range slices.Sorted(maps.Keys(s.launches)) {
			in.Launches = append(in.Launches, Launch{ID: l, State: s.launches[l]})
		}
		return in
	case "paused":
		p, ok := s.pauses[id]
		if !ok {
			s.t.Fatalf("%s: no pause of %s started", line, id)
		}
		in := PauseEnded{Job: p.Job, Checkpoint: p.Checkpoint, Launch: id}
		switch {
		case a.flag["cut"]:
			in.Cut, in.Err = true, errors.New("context canceled")
		case a.flag["unconfirmed"]:
			in.Result = sandboxapi.PauseResult{Launch: id, State: sandboxapi.StateRunning, Fallback: "freeze not confirmed"}
			in.Err = sandboxd.ErrUnconfirmed
		case a.flag["stopping"]:
			in.Err = sandboxd.ErrStopping
			s.launches[id] = sandboxapi.StateStopping
		case a.flag["failed"]:
			in.Err = errors.New("cgroup.freeze: injected")
		case a.flag["ended"]:
			in.Result = sandboxapi.PauseResult{Launch: id, State: sandboxapi.StateEnded}
			s.launches[id] = sandboxapi.StateEnded
		default:
			s.seqs[id]++
			in.Result = sandboxapi.PauseResult{Launch: id, State: sandboxapi.StatePaused, Mode: sandboxapi.ModeFreeze, PauseSeq: s.seqs[id], PIDCount: 1, Frozen: true}
			s.launches[id] = sandboxapi.StatePaused
		}
		return in
	case "stopped":
		st := s.stops[id]
		in := FallbackStopped{Job: st.Job, Checkpoint: st.Checkpoint, Launch: id, Result: st.Result}
		if a.flag["failed"] {
			in.Err = errors.New("kill: injected")
		} else {
			s.launches[id] = sandboxapi.StateEnded
		}
		return in
	case "watched":
		in := EndWatched{Job: s.watches[id], Launch: id, Ended: !a.flag["failed"]}
		if in.Ended {
			s.launches[id] = sandboxapi.StateEnded
		}
		return in
	case "flushed":
		s.durable = true
		return Flushed{}
	case "reopen":
		return ReopenAsked{Checkpoint: cp(id)}
	case "cut":
		return PausesCut{Checkpoint: cp(id)}
	case "continued":
		s.launches[id] = sandboxapi.StateRunning
		return LaunchContinued{Launch: id}
	case "reopened":
		return Reopened{}
	case "launch":
		in := LaunchAsked{Launch: id, Episode: a.kv["episode"], Holding: s.holding}
		if e := a.kv["edits"]; e != "" {
			in.Edits = strings.Split(e, ",")
		}
		return in
	case "recorded":
		return LaunchRecorded{Launch: id, Episode: a.kv["episode"], NoPause: a.flag["nopause"]}
	case "unrecorded":
		return LaunchUnrecorded{Launch: id, Save: a.flag["save"]}
	case "registered":
		if a.flag["started"] {
			s.launches[id] = sandboxapi.StateRunning
		}
		return LaunchRegistered{Launch: id}
	case "takeover":
		v, ok := verdicts[a.kv["verdict"]]
		if !ok {
			s.t.Fatalf("%s: unknown verdict %q", line, a.kv["verdict"])
		}
		return TakeOverAsked{Launch: id, PauseSeq: a.num("seq", 1), Identity: sandboxapi.Identity{PID: 1, Start: uint64(a.num("identity", 1))},
			Verdict: v, Reason: a.kv["verdict"], RecordSeq: a.num("record", -1)}
	case "takenover":
		in := TakeOverDone{Launch: id, PauseSeq: a.num("seq", 1), Identity: sandboxapi.Identity{PID: 1, Start: uint64(a.num("identity", 1))},
			Holding: s.holding}
		if a.flag["failed"] {
			in.Err = errors.New("thaw: injected")
			s.launches[id] = sandboxapi.StateEnded
		} else {
			in.Result = sandboxapi.PauseResult{Launch: id, State: sandboxapi.StateRunning, PauseSeq: in.PauseSeq}
			s.launches[id] = sandboxapi.StateRunning
		}
		return in
	case "collect":
		return Collected{Launch: id, Holding: s.holding}
	case "repoint":
		return RepointAsked{URL: id, Generation: uint64(a.num("gen", 1))}
	case "close":
		return Closing{}
	}
	s.t.Fatalf("unknown script command %q", line)
	return nil
}

func list(xs []string) string {
	if len(xs) == 0 {
		return "-"
	}
	return strings.Join(xs, ",")
}

// show is the stable text form of an effect.
func show(e Effect) string {
	switch e := e.(type) {
	case Report:
		r := e.Report
		if !r.Ready {
			out := "report blockers=" + list(r.Blockers)
			if n, ok := r.Counts["pausing"]; ok {
				out += fmt.Sprintf(" pausing=%d", n)
			}
			return out
		}
		out := fmt.Sprintf("report ready launches=%d", r.Counts["launches"])
		if p := r.Pause; p != nil {
			out += fmt.Sprintf(" pause_seq=%d pids=%d frozen=%v", p.PauseSeq, p.PIDCount, p.Frozen)
			if p.Fallback != "" {
				out += fmt.Sprintf(" fallback=%q", p.Fallback)
			}
		}
		return out
	case StartPause:
		return fmt.Sprintf("pause %s for %s (job %d)", e.Launch, e.Checkpoint, e.Job)
	case StopLaunch:
		return fmt.Sprintf("stop %s after an unconfirmed pause (job %d)", e.Launch, e.Job)
	case WatchEnd:
		return fmt.Sprintf("watch the end of %s (job %d)", e.Launch, e.Job)
	case Flush:
		return fmt.Sprintf("flush the capture (job %d)", e.Job)
	case CutJobs:
		jobs := make([]string, len(e.Jobs))
		for i, j := range e.Jobs {
			jobs[i] = strconv.FormatUint(j, 10)
		}
		return "cut jobs " + list(jobs)
	case ContinueLaunches:
		out := "continue " + list(e.Launches)
		if e.CountHeld {
			out += " count-held"
		}
		return out
	case ContinueTakeOver:
		return "take over " + e.Launch
	case WaitTakeOver:
		return "wait for the take-over of " + e.Launch
	case AnswerAgain:
		return fmt.Sprintf("answer again %s pause_seq=%d", e.Result.State, e.Result.PauseSeq)
	case SaveEpisodes:
		var eps []string
		for _, l := range slices.Sorted(maps.Keys(e.Episodes)) {
			eps = append(eps, l+":"+e.Episodes[l])
		}
		return "save episodes " + list(eps)
	case Notify:
		return "notify"
	case RelayHold:
		return "relay hold"
	case RelayRelease:
		if e.Launch == "" {
			return "relay release"
		}
		return fmt.Sprintf("relay release %s (%s)", e.Launch, e.Why)
	case RelayDrop:
		return fmt.Sprintf("relay drop %s (%s)", e.Launch, e.Why)
	case RelayLabel:
		if len(e.Edits) > 0 {
			return fmt.Sprintf("relay label %s %s edits=%s", e.Launch, e.Episode, strings.Join(e.Edits, ","))
		}
		return fmt.Sprintf("relay label %s %s", e.Launch, e.Episode)
	case RelayRepoint:
		return fmt.Sprintf("relay repoint %s gen=%d", e.URL, e.Generation)
	}
	return fmt.Sprintf("%T", e)
}
