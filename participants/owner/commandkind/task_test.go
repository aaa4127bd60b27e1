package commandkind

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
)

// good is a valid payload; each case of the table below breaks one field.
const good = `{"task":"py-calc","prompt":"fix it","workspace":{"dir":"/srv/py-calc"},"workdir":"/work",
 "env":["A=1"],"setup":[{"command":["true"],"timeout":"10s"}],"pin":["tests/test_calc.py"],
 "verify":{"command":["python3","-m","unittest"],"reward":"json","timeout":"1m"},"harness":{"any":"thing"}}`

func TestParseTaskTakesAGoodTask(t *testing.T) {
	tk, err := ParseTask(json.RawMessage(good))
	if err != nil {
		t.Fatal(err)
	}
	if tk.Name != "py-calc" || tk.workdir() != "/work" || tk.Verify.Reward != RewardJSON || tk.Verify.Timeout.or(0) != time.Minute ||
		tk.Setup[0].Timeout.or(0) != 10*time.Second || tk.pins()[0] != "tests/test_calc.py" {
		t.Fatalf("parsed %+v", tk)
	}
	min, err := ParseTask(json.RawMessage(`{"task":"t","prompt":"p","verify":{"command":["true"]}}`))
	if err != nil {
		t.Fatalf("the smallest task: %v", err)
	}
	if min.workdir() != DefaultWorkdir || !min.Workspace.empty() || min.Verify.Timeout.or(DefaultVerifyTimeout) != DefaultVerifyTimeout {
		t.Fatalf("defaults: %+v", min)
	}
}

// A task's image sets the spec's ImageRef; with no workdir the image's
// WorkingDir applies (the owner sets it), else the task's.
func TestImageSetsTheSpec(t *testing.T) {
	for _, c := range []struct{ fields, image, workdir string }{
		{`"image":"/srv/images/calc:latest"`, "/srv/images/calc:latest", ""},
		{`"image":"registry.example:5000/calc@sha256:` + strings.Repeat("a", 64) + `","workdir":"/src"`, "registry.example:5000/calc@sha256:" + strings.Repeat("a", 64), "/src"},
		{`"workdir":"/src"`, "", "/src"},
		{`"env":[]`, "", DefaultWorkdir},
	} {
		raw := `{"task":"t","prompt":"p","verify":{"command":["true"]},` + c.fields + `}`
		spec, err := Kind{}.Spec("s1", events.Episode{Rollout: "s1"}, json.RawMessage(raw))
		if err != nil {
			t.Fatalf("%s: %v", c.fields, err)
		}
		if spec.ImageRef != c.image || spec.Workdir != c.workdir {
			t.Errorf("%s: ImageRef %q Workdir %q, want %q and %q", c.fields, spec.ImageRef, spec.Workdir, c.image, c.workdir)
		}
	}
}

// Every field is checked, and the error names it.
func TestParseTaskNamesTheBadField(t *testing.T) {
	for _, c := range []struct{ old, new, field string }{
		{`"task":"py-calc"`, `"task":"../x"`, "task"},
		{`"task":"py-calc"`, `"task":""`, "task"},
		{`"prompt":"fix it"`, `"prompt":"  "`, "prompt"},
		{`{"dir":"/srv/py-calc"}`, `{"dir":"srv/py-calc"}`, "workspace.dir"},
		{`{"dir":"/srv/py-calc"}`, `{"dir":"/srv/../etc"}`, "workspace.dir"},
		{`{"dir":"/srv/py-calc"}`, `{"dir":"/a","tarball":"/b.tar"}`, "workspace.dir"},
		{`{"dir":"/srv/py-calc"}`, `{"tarball":"x.tgz"}`, "workspace.tarball"},
		{`{"dir":"/srv/py-calc"}`, `{"git":"/srv/repo"}`, "workspace.commit"},
		{`{"dir":"/srv/py-calc"}`, `{"git":"/srv/repo","commit":"main"}`, "workspace.commit"},
		{`{"dir":"/srv/py-calc"}`, `{"dir":"/a","commit":"abcdef1"}`, "workspace.commit"},
		{`"workdir":"/work"`, `"workdir":"work"`, "workdir"},
		{`"env":["A=1"]`, `"env":["A"]`, "env[0]"},
		{`"env":["A=1"]`, `"env":["STILLPOINT_SESSION_DATA={}"]`, "env[0]"},
		{`"command":["true"]`, `"command":[]`, "setup[0].command"},
		{`"timeout":"10s"`, `"timeout":"-1s"`, "setup[0].timeout"},
		{`"timeout":"10s"`, `"timeout":"2h"`, "setup[0].timeout"},
		{`"timeout":"10s"`, `"timeout":"soon"`, "setup[0].timeout"},
		{`"pin":["tests/test_calc.py"]`, `"pin":["/etc/passwd"]`, "pin[0]"},
		{`"pin":["tests/test_calc.py"]`, `"pin":["../x"]`, "pin[0]"},
		{`"pin":["tests/test_calc.py"]`, `"pin":["."]`, "pin[0]"},
		{`"pin":["tests/test_calc.py"]`, `"pin":["-rf"]`, "pin[0]"},
		{`"pin":["tests/test_calc.py"]`, `"pin":["a","./a"]`, "pin[1]"},
		{`"command":["python3","-m","unittest"]`, `"command":[""]`, "verify.command"},
		{`"reward":"json"`, `"reward":"maybe"`, "verify.reward"},
		{`"harness":{"any":"thing"}`, `"harness":[1]`, "harness"},
		{`"harness":{"any":"thing"}`, `"harnes":{}`, "harnes"},
		{`"workdir":"/work"`, `"image":""`, "image"},
		{`"workdir":"/work"`, `"image":"/srv/img\u0000"`, "image"},
		{`"workdir":"/work"`, `"image":"/srv/img\n"`, "image"},
		{`"workdir":"/work"`, `"image":"` + strings.Repeat("x", MaxImageRef+1) + `"`, "image"},
		{`"workdir":"/work"`, `"image":7`, "image"},
	} {
		raw := strings.Replace(good, c.old, c.new, 1)
		if raw == good {
			t.Fatalf("case %q does not change the task", c.new)
		}
		_, err := ParseTask(json.RawMessage(raw))
		if !errors.Is(err, ErrTask) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("with %s: %v, want ErrTask naming %s", c.new, err, c.field)
		}
	}
	if _, err := ParseTask(json.RawMessage(`{"task":"t"}`)); err == nil || !strings.Contains(err.Error(), "prompt") || !strings.Contains(err.Error(), "verify.command") {
		t.Errorf("a task without prompt and verify: %v, want both named", err)
	}
	long := `{"task":"t","prompt":"` + strings.Repeat("x", MaxPrompt+1) + `","verify":{"command":["true"]}}`
	if _, err := ParseTask(json.RawMessage(long)); err == nil || !strings.Contains(err.Error(), "prompt") {
		t.Errorf("a prompt past MaxPrompt: %v", err)
	}
}

// The JSON reward is the last non-empty line's "reward" number.
func TestRewardOf(t *testing.T) {
	r, obj, err := rewardOf([]byte("Ran 3 tests\n{\"reward\": 0.5, \"passed\": 1}\n\n"))
	if err != nil || r != 0.5 || string(obj) != `{"reward": 0.5, "passed": 1}` {
		t.Fatalf("rewardOf: %v %s %v", r, obj, err)
	}
	for _, out := range []string{"", "ok\n", `{"reward":"1"}`, `{"passed":1}`, "{\"reward\":1}\nthen more"} {
		if _, _, err := rewardOf([]byte(out)); err == nil {
			t.Errorf("rewardOf(%q) took it", out)
		}
	}
}
