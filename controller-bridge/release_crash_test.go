package bridge_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/timeline"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// TestBridgeCrashAtEachWriteOfARelease kills the bridge (SIGKILL, a process
// of its own) after each write of a release (the failpoints of
// controller-bridge/internal/failpoint), with c1, c2 and c3 committed: a
// release that keeps c3, the final one, and one a member fails. At the
// kill, no checkpoint reads as committed with records missing: each is
// gone, marked released, or whole. The next bridge finishes the release:
// one outcome, naming what was deleted (before the crash too); nothing it
// deletes is left, nothing it keeps is touched, every member released
// once.
func TestBridgeCrashAtEachWriteOfARelease(t *testing.T) {
	tier.E2E(t)
	cases := []struct {
		failpoint string
		final     bool // the final release: nothing kept, LATEST goes
		fail      bool // a member fails its release: the bridge marks, deletes nothing
	}{
		{failpoint: "bridge/after-release"},
		{failpoint: "bridge/after-release-mark"},
		{failpoint: "bridge/after-release-records"},
		{failpoint: "bridge/after-release-member-list"},
		{failpoint: "bridge/mid-release"},
		{failpoint: "bridge/after-release-manifest"},
		{failpoint: "bridge/after-release-outcome"},
		{failpoint: "bridge/after-release-manifest", final: true},
		{failpoint: "bridge/after-release-latest", final: true},
		{failpoint: "bridge/after-release-outcome", final: true},
		{failpoint: "bridge/after-release-mark", fail: true},
		{failpoint: "bridge/after-release-outcome", fail: true},
	}
	for _, c := range cases {
		name := c.failpoint
		switch {
		case c.final:
			name += "/final"
		case c.fail:
			name += "/a-member-fails"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := jstest.Start(t)
			hs := membertest.StartMembers(t, env, run, 2, membertest.Options{Episodes: 1})
			b := startBridge(t, env, bridge.Config{})
			all := []string{"c1", "c2", "c3"}
			for _, id := range all {
				if res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: id}); err != nil || res.Status != bridgeapi.StatusCommitted {
					t.Fatalf("%s: %+v %v", id, res, err)
				}
			}
			if c.fail {
				hs[1].Participant.FailRelease(errors.New("snapshot store down"))
			}
			req, released, kept := bridgeapi.ReleaseRequest{KeepLatest: 1}, []string{"c1", "c2"}, []string{"c3"}
			if c.final {
				req, released, kept = bridgeapi.ReleaseRequest{}, all, nil
			}

			dying, cl := startBridgeProcess(t, env, c.failpoint)
			cctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			if res, err := cl.Release(cctx, req); err == nil {
				t.Fatalf("the bridge answered %+v instead of dying at %s", res, c.failpoint)
			}
			exited(t, dying, 30*time.Second)
			for _, id := range all {
				if why := readsCommittedWithRecordsMissing(t, env, id); why != "" {
					t.Errorf("killed at %s: %s reads as committed, but %s", c.failpoint, id, why)
				}
			}

			_, cl = startBridgeProcess(t, env, "")
			st, err := cl.Status(cctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Open != "" {
				t.Fatalf("still open after recovery: %s", st.Open)
			}
			for _, h := range hs {
				if n := h.Participant.Count("release"); n != 1 {
					t.Errorf("%s released %d times", h.Name, n)
				}
			}
			outcome := releaseOutcome(t, env)
			if c.fail {
				f, ok := outcome.(events.ReleaseFailed)
				if !ok || len(f.Errors) != 1 || f.Errors[0].Member != hs[1].Name {
					t.Fatalf("outcome %#v, want release.failed naming %s", outcome, hs[1].Name)
				}
				// Nothing deleted; every checkpoint not kept is marked
				// with the failure, and restores no more.
				for _, id := range all {
					m := manifestOf(t, env, id)
					if m == nil || len(recordsOf(t, env, id)) != 2 || len(memberLists(t, env, id)) != 1 {
						t.Errorf("%s after a failed release: manifest %+v, records %v", id, m, recordsOf(t, env, id))
						continue
					}
					if marked := m.Released != nil && len(m.Released.Failed) == 1; marked != slices.Contains(released, id) {
						t.Errorf("%s after a failed release: mark %+v", id, m.Released)
					}
				}
				return
			}
			done, ok := outcome.(events.ReleaseCompleted)
			if !ok || !slices.Equal(sorted(done.Deleted), released) || !slices.Equal(done.Keep, append([]string{}, kept...)) {
				t.Fatalf("outcome %#v, want release.completed deleting %v, keeping %v", outcome, released, kept)
			}
			for _, id := range released {
				if m := manifestOf(t, env, id); m != nil || len(recordsOf(t, env, id)) > 0 || len(memberLists(t, env, id)) > 0 {
					t.Errorf("released %s left: manifest %+v, records %v, member lists %v", id, m, recordsOf(t, env, id), memberLists(t, env, id))
				}
			}
			for _, id := range kept {
				if m := manifestOf(t, env, id); m == nil || m.Released != nil || len(recordsOf(t, env, id)) != 2 || len(memberLists(t, env, id)) != 1 {
					t.Errorf("kept %s: manifest %+v, records %v, member lists %v", id, m, recordsOf(t, env, id), memberLists(t, env, id))
				}
			}
			switch {
			case c.final && st.Latest != nil:
				t.Errorf("LATEST %+v after the final release", st.Latest)
			case !c.final && (st.Latest == nil || st.Latest.CheckpointID != "c3"):
				t.Errorf("LATEST %+v, want c3", st.Latest)
			}
		})
	}
}

// readsCommittedWithRecordsMissing says why checkpoint id reads as a
// committed checkpoint whose records are not all there ("" if it does not:
// its manifest is gone or marked released, or its member list and every
// records object it names are there).
func readsCommittedWithRecordsMissing(t *testing.T, env *jstest.Env, id string) string {
	t.Helper()
	// The stored key alone: a marked one may name a member list deleted.
	e, err := env.Bus.Manifests.Get(t.Context(), events.ManifestKey(run, id))
	if errors.Is(err, natsjs.ErrKeyNotFound) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	var m events.CheckpointManifest
	if err := json.Unmarshal(e.Value(), &m); err != nil {
		t.Fatal(err)
	}
	if m.Released != nil {
		return ""
	}
	lists := memberLists(t, env, id)
	if m.MemberList == nil || !slices.Equal(lists, []string{m.MemberList.Object}) {
		return "its member list is not there"
	}
	if got := recordsOf(t, env, id); len(got) != 2 {
		return "its records are " + strings.Join(got, ", ")
	}
	return ""
}

// recordsOf lists the records objects of checkpoint id.
func recordsOf(t *testing.T, env *jstest.Env, id string) []string {
	t.Helper()
	var out []string
	for _, o := range objects(t, env) {
		if strings.Contains(o, "/"+id+"/") {
			out = append(out, o)
		}
	}
	return out
}

// releaseOutcome returns the run's one release outcome, failing the test
// if there is none or more than one.
func releaseOutcome(t *testing.T, env *jstest.Env) events.Data {
	t.Helper()
	tl, err := timeline.Read(t.Context(), env.JS, run, "")
	if err != nil {
		t.Fatal(err)
	}
	var out []events.Data
	for _, e := range tl {
		if e.Type == events.TypeReleaseCompleted || e.Type == events.TypeReleaseFailed {
			out = append(out, e.Data)
		}
	}
	if len(out) != 1 {
		t.Fatalf("%d release outcomes, want one: %+v", len(out), out)
	}
	return out[0]
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
