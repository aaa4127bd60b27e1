package machine

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/stillpoint/stillpoint/events"
)

// newCheckpointID is the id of a checkpoint whose request names none:
// c-<UTC time>, made a valid token.
func newCheckpointID(now time.Time) string {
	b := []byte("c-" + now.UTC().Format("20060102T150405.000Z"))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			b[i] = '-'
		}
	}
	return string(b)
}

// buildManifest assembles the checkpoint manifest (schema 2) and its
// member list from the commit's acks: each member's manifest is the one
// its once-only commit ack carries (none: it exported nothing), and must
// name that member in this run and checkpoint. It returns the list's
// bytes; the manifest names them (MemberList) and holds the members in
// memory.
//
// The episodes of prev, the checkpoint before, whose members are not all
// here are carried forward or retired (carryForward).
func buildManifest(run string, now time.Time, c events.Commit, t *Tally, restarts []string,
	prepSeq uint64, prepMS, commitMS int64, prev *events.CheckpointManifest, unfinished map[string]bool) (events.CheckpointManifest, []byte, error) {
	m := events.CheckpointManifest{Schema: events.CheckpointSchema, Run: run, CheckpointID: c.CheckpointID, Epoch: c.Epoch,
		Created: now.UTC(), Restarted: restarts, PrepareSeq: prepSeq, CommitSeq: c.Seq, PrepareMS: prepMS, CommitMS: commitMS, Stop: c.Stop}
	restarted := map[string]bool{}
	for _, r := range restarts {
		restarted[r] = true
	}
	continued := map[string]bool{}
	acks := t.Acks()
	for _, member := range t.Members() {
		ack, _ := acks[member].(events.CommitAck)
		if ack.Manifest == nil {
			continue // exported nothing: no manifest, no entry
		}
		mm := *ack.Manifest
		mm.Episodes = slices.Clone(mm.Episodes)
		if err := mm.Validate(); err != nil {
			return m, nil, fmt.Errorf("member %s: %w", member, err)
		}
		if mm.Member != member || mm.CheckpointID != c.CheckpointID || mm.Run != run {
			return m, nil, fmt.Errorf("member %s: its commit ack's manifest names %s/%s/%s", member, mm.Run, mm.CheckpointID, mm.Member)
		}
		m.Members = append(m.Members, mm)
		for _, k := range mm.Episodes {
			if !restarted[k] {
				continued[k] = true
			}
		}
	}
	for k := range continued {
		m.Continued = append(m.Continued, k)
	}
	sort.Strings(m.Continued)
	m.Committed = t.Members()
	carryForward(&m, prev, m.Committed, unfinished)
	list, ref, err := events.EncodeMemberList(run, c.CheckpointID, m.Committed, m.Members)
	if err != nil {
		return m, nil, err
	}
	m.MemberList = &ref
	slices.SortFunc(m.Members, func(a, b events.MemberManifest) int { return strings.Compare(string(a.Member), string(b.Member)) })
	return m, list, m.Validate()
}

// restartsOf returns the episodes that the prepare's acks report as
// restarts, sorted; nil for no tally.
func restartsOf(t *Tally) []string {
	if t == nil {
		return nil
	}
	seen := map[string]bool{}
	var out []string
	for _, ack := range t.Acks() {
		if p, ok := ack.(events.PrepareAck); ok {
			for _, r := range p.Restarts {
				if !seen[r] {
					seen[r] = true
					out = append(out, r)
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// scopeOf returns the commit scope: the controller's episodes minus the
// restarts, or nil (every episode the members hold) when it named none.
func scopeOf(episodes, restarts []string) []events.Episode {
	if len(episodes) == 0 {
		return nil
	}
	skip := map[string]bool{}
	for _, r := range restarts {
		skip[r] = true
	}
	var scope []events.Episode
	for _, e := range episodes {
		if skip[e] {
			continue
		}
		ep, _ := events.ParseEpisode(e)
		scope = append(scope, ep)
	}
	return scope
}
