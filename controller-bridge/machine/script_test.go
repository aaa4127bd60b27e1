package machine

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/golden"
)

// The golden scripts in testdata/ are named after the bridge rules of
// PROTOCOL §5 and the invariants of §7. Each is a list of inputs, one a
// line, each followed by the effects the machine answered with, indented
// by two spaces. Lines starting with # are comments. go test -update
// rewrites the indented lines with what the machine does now: read the
// diff before committing it.
var update = flag.Bool("update", false, "rewrite the expected effects of testdata/*.txt")

func TestScripts(t *testing.T) {
	golden.RunAll(t, *update, func(t *testing.T) func(string) []string {
		s := newScript(t)
		return s.do
	})
}

// script drives a Machine as a bridge's driver would, from script lines.
type script struct {
	t   *testing.T
	m   *Machine
	now time.Time

	// The run as the harness's bus holds it.
	seq, stream, epoch uint64
	fence              uint64 // the stream sequence of the last phase
	last               events.PhaseEvent
	lastID             string
	lastAt             time.Time
	members            []events.Member

	publish     *PublishPhase // the publish asked and not answered
	gathering   events.PhaseEvent
	create      *events.CheckpointManifest
	outcome     events.Type
	readOutcome events.Type
	checkpoints []events.CheckpointManifest
	deletes     []Deletion
	history     []PhasePublished
}

func newScript(t *testing.T) *script {
	return &script{t: t, m: New(Config{Run: "run1", PhaseTimeout: 10 * time.Second, ResumeTimeout: 5 * time.Second}),
		now: t0, members: []events.Member{"agent.a", "owner.b"}}
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

func (a args) list(k string) []string {
	if v, ok := a.kv[k]; ok && v != "" {
		return strings.Split(v, ",")
	}
	return nil
}

func (a args) members(k string, def []events.Member) []events.Member {
	v, ok := a.kv[k]
	if !ok {
		return def
	}
	var out []events.Member
	for _, x := range strings.Split(v, ",") {
		if x != "" {
			out = append(out, events.Member(x))
		}
	}
	return out
}

func (a args) num(k string, def uint64) uint64 {
	if v, ok := a.kv[k]; ok {
		n, _ := strconv.ParseUint(v, 10, 64)
		return n
	}
	return def
}

func (a args) dur(k string, def time.Duration) time.Duration {
	if v, ok := a.kv[k]; ok {
		d, _ := time.ParseDuration(v)
		return d
	}
	return def
}

func (s *script) view() View {
	return View{Seq: s.seq, StreamSeq: s.fence, Epoch: s.epoch, Last: s.last, LastID: s.lastID, LastAt: s.lastAt, Members: s.members}
}

// do runs one line and returns what the machine did, printed.
func (s *script) do(line string) []string {
	words := strings.Fields(line)
	cmd, a := words[0], parse(words[1:])
	switch cmd {
	case "wait":
		d, err := time.ParseDuration(a.pos[0])
		if err != nil {
			s.t.Fatalf("%s: %v", line, err)
		}
		s.now = s.now.Add(d)
		return nil
	case "fleet":
		s.members = a.members("members", nil)
		return nil
	case "state?":
		return []string{s.m.State().String()}
	case "open?":
		return []string{fmt.Sprintf("open %q", s.m.Open())}
	case "history":
		s.history = append(s.history, s.historyPhase(a))
		return nil
	case "checkpoint-exists":
		s.checkpoints = append(s.checkpoints, s.manifest(a.pos[0], a.flag["aborted"], nil))
		return nil
	}
	in, ok := s.input(cmd, a, line)
	if !ok {
		return []string{"(nothing asked to answer)"}
	}
	effs, err := s.m.Step(s.now, in)
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	s.observe(effs)
	out := make([]string, 0, len(effs))
	for _, e := range effs {
		out = append(out, show(e))
	}
	return out
}

// observe remembers what the machine asked, to answer it.
func (s *script) observe(effs []Effect) {
	for _, e := range effs {
		switch e := e.(type) {
		case PublishPhase:
			s.publish = &e
		case StartGathering:
			s.gathering = e.Event
		case CreateManifest:
			man := e.Manifest
			s.create = &man
		case PublishOutcome:
			s.outcome = e.Outcome.Type()
		case ReadOutcome:
			s.readOutcome = e.Type
		case DeleteCheckpoints:
			s.deletes = e.Delete
		}
	}
}

// input turns a line into the machine's input.
func (s *script) input(cmd string, a args, line string) (Input, bool) {
	t := s.t
	switch cmd {
	case "checkpoint":
		req := bridgeapi.CheckpointRequest{Hold: a.flag["hold"], Stop: a.flag["stop"], Episodes: a.list("episodes"),
			TimeoutMS: a.dur("timeout", 0).Milliseconds()}
		if len(a.pos) > 0 && a.pos[0] != "hold" && a.pos[0] != "stop" {
			req.ID = a.pos[0]
		}
		v := s.view()
		v.Members = a.members("members", s.members)
		if st, ok := a.kv["exists"]; ok {
			man := s.manifest(req.ID, st == "aborted", v.Members)
			v.Manifest = &man
		}
		return CheckpointAsked{Request: req, View: v}, true
	case "commit", "abort":
		v := s.view()
		if a.flag["fenced"] {
			v.LastID = "another-bridge"
		}
		if cmd == "commit" {
			return CommitAsked{ID: a.pos[0], Stop: a.flag["stop"], View: v}, true
		}
		return AbortAsked{ID: a.pos[0], View: v}, true
	case "shutdown":
		return Shutdown{View: s.view()}, true
	case "restore":
		req := bridgeapi.RestoreRequest{ID: a.kv["id"], Source: a.kv["source"], TimeoutMS: a.dur("timeout", 0).Milliseconds()}
		v := s.view()
		v.Members = a.members("fresh", s.members)
		src := req.Source
		if l, ok := a.kv["latest"]; ok {
			v.Latest = &events.Latest{CheckpointID: l, Epoch: s.epoch}
			if src == "" {
				src = l
			}
		}
		if src != "" && !a.flag["no-source"] {
			man := s.manifest(src, a.flag["aborted-source"], nil)
			man.Continued = a.list("continued")
			for _, r := range a.list("records") {
				name, n, _ := strings.Cut(r, ":")
				count, _ := strconv.Atoi(n)
				man.Members = append(man.Members, events.MemberManifest{Member: events.Member(name), Count: count})
			}
			if op, ok := a.kv["released-by"]; ok {
				man.Released = &events.ReleaseMark{Op: op, Deleted: map[events.Member][]string{"owner.b": {"snap-1"}},
					Failed: []events.MemberError{{Member: "agent.a", Code: "release_failed", Detail: "disk"}}}
			}
			v.Manifest = &man
		}
		return RestoreAsked{Request: req, View: v}, true
	case "retire":
		var eps []events.Episode
		for _, k := range a.list("episodes") {
			e, err := events.ParseEpisode(k)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			eps = append(eps, e)
		}
		v := s.view()
		v.Members = a.members("members", s.members)
		return RetireAsked{Episodes: eps, View: v}, true
	case "forget":
		v := s.view()
		v.Members = a.members("members", s.members)
		return ForgetAsked{Rollouts: a.list("rollouts"), View: v}, true
	case "release":
		v := s.view()
		v.Members = a.members("members", s.members)
		v.Checkpoints = s.checkpoints
		return ReleaseAsked{Request: bridgeapi.ReleaseRequest{Keep: a.list("keep"), KeepLatest: int(a.num("keep-latest", 0))}, View: v}, true
	case "published":
		if s.publish == nil {
			return nil, false
		}
		s.stream = a.num("stream", s.stream+1)
		p := PhasePublished{Event: s.publish.Event, StreamSeq: s.stream, ID: fmt.Sprintf("%s.%d", s.publish.Event.Phase(), s.publish.Event.Header().Seq), At: s.now}
		s.seq, s.epoch, s.last, s.lastID, s.lastAt = p.Event.Header().Seq, p.Event.Header().Epoch, p.Event, p.ID, p.At
		s.fence, s.publish = s.stream, nil
		return p, true
	case "fenced":
		return EffectFailed{Err: fmt.Errorf("%w: publishing: wrong last sequence", bridgeapi.ErrFenced)}, true
	case "failed":
		return EffectFailed{Err: errors.New(strings.Join(a.pos, " "))}, true
	case "gathering":
		if s.gathering == nil {
			return nil, false
		}
		return GatherStarted{Seq: s.gathering.Header().Seq, Backlog: a.num("backlog", 0)}, true
	case "ack":
		return s.ack(a), true
	case "undecodable":
		s.stream = a.num("stream", s.stream+1)
		return AckSeen{StreamSeq: s.stream}, true
	case "gone":
		why := map[string]Gone{"not-alive": GoneNotAlive, "replaced": GoneReplaced, "left": GoneLeft, "silent": GoneSilent}[a.kv["why"]]
		return MemberGone{Member: events.Member(a.pos[0]), Why: why}, true
	case "list-written":
		return MemberListWritten{}, true
	case "created":
		if s.create == nil {
			return nil, false
		}
		return ManifestCreated{Manifest: *s.create, Created: true}, true
	case "found":
		have := *s.create
		have.Aborted = a.flag["aborted"]
		have.Reason = ""
		if have.Aborted {
			have.Reason = "aborted by another bridge"
			have.Members, have.Continued, have.Restarted = nil, nil, nil
		}
		return ManifestCreated{Manifest: have}, true
	case "latest-moved":
		return LatestMoved{}, true
	case "outcome-published":
		return OutcomePublished{Type: s.outcome}, true
	case "marked":
		return ReleasedMarked{}, true
	case "listed":
		return CheckpointsListed{Checkpoints: s.checkpoints, Purged: a.list("purged")}, true
	case "deleted":
		gone := map[string]bool{}
		for _, d := range s.deletes {
			gone[d.CheckpointID] = !d.KeepMarker
		}
		var left []events.CheckpointManifest
		for _, c := range s.checkpoints {
			if !gone[c.CheckpointID] {
				left = append(left, c)
			}
		}
		s.checkpoints = left
		return CheckpointsDeleted{}, true
	case "tick":
		return Tick{}, true
	case "recover":
		h := s.history
		s.history = nil
		if len(h) > 0 {
			p := h[len(h)-1]
			s.seq, s.fence, s.epoch, s.last, s.lastID, s.lastAt = p.Event.Header().Seq, p.StreamSeq, p.Event.Header().Epoch, p.Event, p.ID, p.At
			s.stream = max(s.stream, p.StreamSeq)
		}
		return Recover{History: h}, true
	case "manifest":
		switch a.pos[0] {
		case "none":
			return ManifestFound{}, true
		default:
			man := s.manifest(a.kv["id"], a.pos[0] == "aborted", s.last.Header().Members)
			man.Stop = a.flag["stop"]
			return ManifestFound{Manifest: &man}, true
		}
	case "outcome":
		if a.pos[0] == "none" {
			return OutcomeSeen{Type: s.readOutcome}, true
		}
		var d events.Data
		switch s.readOutcome {
		case events.TypeRestoreCompleted:
			d = events.RestoreCompleted{Restored: a.list("restored")}
		case events.TypeRestoreFailed:
			d = events.RestoreFailed{}
		case events.TypeReleaseCompleted:
			d = events.ReleaseCompleted{}
		case events.TypeReleaseFailed:
			d = events.ReleaseFailed{}
		default:
			d = events.CheckpointCommitted{}
		}
		return OutcomeSeen{Type: s.readOutcome, Data: d}, true
	case "replayed":
		return Replayed{}, true
	}
	t.Fatalf("unknown script command %q", line)
	return nil, false
}

// manifest is a checkpoint key as the harness's KV would hold it.
func (s *script) manifest(id string, aborted bool, members []events.Member) events.CheckpointManifest {
	if id == "" && s.last != nil {
		id = s.last.Header().CheckpointID
	}
	m := events.CheckpointManifest{Schema: events.CheckpointSchema, Run: "run1", CheckpointID: id, Epoch: s.epoch, Created: s.now, Aborted: aborted}
	if aborted {
		m.Reason = "aborted before"
		return m
	}
	for _, mm := range members {
		m.Members = append(m.Members, events.MemberManifest{Member: mm})
	}
	return m
}

// historyPhase is a phase of the history a replay reads back.
func (s *script) historyPhase(a args) PhasePublished {
	p, id := events.Phase(a.pos[0]), a.pos[1]
	seq := a.num("seq", 1)
	// As the bridge reads it back: its sandbox daemons in a roster, its
	// names known.
	h := events.PhaseHeader{Run: "run1", CheckpointID: id, Seq: seq, Epoch: a.num("epoch", 0),
		Deadline: s.now.Add(a.dur("deadline", 10*time.Second)).UTC()}.Address(a.members("members", s.members))
	var e events.PhaseEvent
	switch p {
	case events.PhasePrepare:
		e = events.Prepare{PhaseHeader: h}
	case events.PhaseRenew:
		e = events.Renew{PhaseHeader: h}
	case events.PhaseCommit:
		e = events.Commit{PhaseHeader: h, Stop: a.flag["stop"]}
	case events.PhaseResume:
		e = events.Resume{PhaseHeader: h, Aborted: a.flag["aborted"]}
	case events.PhaseRestore:
		r := events.Restore{PhaseHeader: h, Source: a.kv["source"]}
		for _, k := range a.list("scope") {
			ep, _ := events.ParseEpisode(k)
			r.Scope = append(r.Scope, ep)
		}
		e = r
	case events.PhaseRetire:
		r := events.Retire{PhaseHeader: h}
		for _, k := range a.list("episodes") {
			ep, _ := events.ParseEpisode(k)
			r.Episodes = append(r.Episodes, ep)
		}
		e = r
	case events.PhaseRelease:
		e = events.Release{PhaseHeader: h, Keep: a.list("keep")}
	case events.PhaseForget:
		e = events.Forget{PhaseHeader: h, Rollouts: a.list("rollouts")}
	}
	return PhasePublished{Event: e, StreamSeq: a.num("stream", seq*10), ID: fmt.Sprintf("%s.%d", p, seq), At: s.now.Add(-a.dur("ago", 0))}
}

// ack is an ack of the phase gathered, unless the line says otherwise.
func (s *script) ack(a args) AckSeen {
	m := events.Member(a.pos[0])
	g := s.gathering.Header()
	h := events.AckHeader{Run: "run1", Member: m, Seq: a.num("seq", g.Seq), CheckpointID: g.CheckpointID, Epoch: a.num("epoch", g.Epoch), OK: true}
	if c, ok := a.kv["checkpoint"]; ok {
		h.CheckpointID = c
	}
	if code, ok := a.kv["error"]; ok {
		h.Fail(code, "failed on purpose")
	}
	s.stream = a.num("stream", s.stream+1)
	phase := s.gathering.Phase()
	if p, ok := a.kv["phase"]; ok {
		phase = events.Phase(p)
	}
	var ack events.Ack
	switch phase {
	case events.PhasePrepare:
		p := events.PrepareAck{AckHeader: h, Ready: !a.flag["not-ready"], Restarts: a.list("restarts")}
		p.SetBlockers(a.list("blockers"))
		ack = p
	case events.PhaseCommit:
		// A member that exported nothing (no-records) acks with no
		// manifest; forged=<member> carries another member's manifest.
		c := events.CommitAck{AckHeader: h}
		if h.OK && !a.flag["no-records"] {
			eps := a.list("episodes")
			sha := strings.Repeat("ab", 32)
			of := m
			if f, ok := a.kv["forged"]; ok {
				of = events.Member(f)
			}
			c.Manifest = &events.MemberManifest{Schema: events.ManifestSchema, Run: "run1", CheckpointID: h.CheckpointID, Member: of,
				Object: events.RecordsObject("run1", h.CheckpointID, of, sha), SHA256: sha, Count: len(eps), Size: int64(10 * len(eps)), Episodes: eps}
		}
		ack = c
	case events.PhaseResume:
		ack = events.ResumeAck{AckHeader: h}
	case events.PhaseRestore:
		ack = events.RestoreAck{AckHeader: h, Restored: a.list("restored")}
	case events.PhaseRetire:
		ack = events.RetireAck{AckHeader: h}
	case events.PhaseForget:
		ack = events.ForgetAck{AckHeader: h}
	case events.PhaseRelease:
		ack = events.ReleaseAck{AckHeader: h, Deleted: a.list("deleted")}
	}
	return AckSeen{Ack: ack, StreamSeq: s.stream}
}
