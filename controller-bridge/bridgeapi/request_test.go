package bridgeapi_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
)

// TestValidate: every request names what is wrong with it, wrapped in
// ErrBadRequest, and a valid one passes.
func TestValidate(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want string // "" for valid
	}{
		{"checkpoint ok", bridgeapi.CheckpointRequest{ID: "c1", Episodes: []string{"r1", "r2-a3"}, TimeoutMS: 10}.Validate(), ""},
		{"checkpoint id", bridgeapi.CheckpointRequest{ID: "a.b"}.Validate(), "checkpoint_id"},
		{"checkpoint episode", bridgeapi.CheckpointRequest{Episodes: []string{"ok", "../x"}}.Validate(), "episodes[1]"},
		{"checkpoint hold and stop", bridgeapi.CheckpointRequest{Hold: true, Stop: true}.Validate(), "hold and stop"},
		{"checkpoint every problem", bridgeapi.CheckpointRequest{ID: "a b", TimeoutMS: -1}.Validate(), "timeout_ms: negative"},
		{"restore ok", bridgeapi.RestoreRequest{Source: "c1", ID: "r1"}.Validate(), ""},
		{"restore id", bridgeapi.RestoreRequest{ID: "r/1"}.Validate(), "restore_id"},
		{"restore timeout", bridgeapi.RestoreRequest{TimeoutMS: -5}.Validate(), "timeout_ms"},
		{"release ok", bridgeapi.ReleaseRequest{Keep: []string{"c1"}, KeepLatest: 2}.Validate(), ""},
		{"release keep", bridgeapi.ReleaseRequest{Keep: []string{"c*"}}.Validate(), "keep[0]"},
		{"release keep_latest", bridgeapi.ReleaseRequest{KeepLatest: -1}.Validate(), "keep_latest"},
		{"forget none", bridgeapi.ForgetRequest{}.Validate(), "at least one rollout"},
		{"forget id", bridgeapi.ForgetRequest{Rollouts: []string{"r1", "r 2"}}.Validate(), "rollouts[1]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			switch {
			case c.want == "" && c.err != nil:
				t.Fatalf("valid request refused: %v", c.err)
			case c.want == "":
			case !errors.Is(c.err, bridgeapi.ErrBadRequest) || !strings.Contains(c.err.Error(), c.want):
				t.Fatalf("error %v, want ErrBadRequest naming %q", c.err, c.want)
			}
		})
	}
	if _, err := (bridgeapi.RetireRequest{}).Parse(); !errors.Is(err, bridgeapi.ErrBadRequest) {
		t.Errorf("a retire of nothing: %v", err)
	}
	if eps, err := (bridgeapi.RetireRequest{Episodes: []string{"r1-a2"}}).Parse(); err != nil || len(eps) != 1 || eps[0].Attempt != 2 {
		t.Errorf("retire r1-a2: %v %v", eps, err)
	}
}

// TestRoutes: the client's paths are the server's patterns filled in, and
// an id is escaped.
func TestRoutes(t *testing.T) {
	if got := bridgeapi.CommitPath("c1"); got != "/v1/checkpoints/c1/commit" {
		t.Errorf("CommitPath: %s", got)
	}
	if got := bridgeapi.CheckpointPath("a/b"); got != "/v1/checkpoints/a%2Fb" {
		t.Errorf("CheckpointPath escapes: %s", got)
	}
	if bridgeapi.PathAbort != "/v1/checkpoints/{id}/abort" {
		t.Errorf("PathAbort: %s", bridgeapi.PathAbort)
	}
}

// TestWire: the JSON of the small bodies is what docs/API.md names.
func TestWire(t *testing.T) {
	for _, c := range []struct {
		v    any
		want string
	}{
		{bridgeapi.CommitRequest{Stop: true}, `{"stop":true}`},
		{bridgeapi.RetireRequest{Episodes: []string{"r1"}}, `{"episodes":["r1"]}`},
		{bridgeapi.ForgetRequest{Rollouts: []string{"r1"}}, `{"rollouts":["r1"]}`},
		{bridgeapi.ReleaseRequest{KeepLatest: 1}, `{"keep_latest":1}`},
		{bridgeapi.RestoreRequest{Source: "c1"}, `{"source_checkpoint_id":"c1"}`},
		{bridgeapi.CheckpointRequest{ID: "c1", Hold: true}, `{"checkpoint_id":"c1","hold":true}`},
		// An empty list says the controller has nothing unfinished; nil says nothing.
		{bridgeapi.CheckpointRequest{ID: "c1", Unfinished: []string{}}, `{"checkpoint_id":"c1","unfinished":[]}`},
	} {
		b, err := json.Marshal(c.v)
		if err != nil || string(b) != c.want {
			t.Errorf("%T: %s %v, want %s", c.v, b, err, c.want)
		}
	}
}
