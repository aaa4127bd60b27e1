package owner

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// logged decodes the owner's log lines initLog wrote.
func logged(t *testing.T, b *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("the owner's log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	b.Reset()
	return out
}

// A sandbox's init output reaches the owner's log a line at a time, naming
// the sandbox: the daemon's own JSON lines whole, at debug unless they
// warn, a plain line (a daemon that could not start) as a warning, a line
// split across writes joined, an overlong one cut.
func TestInitOutputGoesToTheOwnersLog(t *testing.T) {
	var b bytes.Buffer
	o := &Owner{log: zerolog.New(&b)}
	w := o.initOutput("sb-1")
	write := func(s string) {
		if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	write(`{"level":"info","message":"joined"}` + "\n" + `{"level":"error","mess`)
	write(`age":"lost the bus"}` + "\n\n")
	write("sandboxd: member: connect: nats: no servers available\n")
	got := logged(t, &b)
	if len(got) != 3 {
		t.Fatalf("%d lines logged, want 3: %v", len(got), got)
	}
	for i, want := range []struct{ level, msg string }{{"debug", "joined"}, {"error", "lost the bus"}} {
		d, _ := got[i]["daemon"].(map[string]any)
		if got[i]["level"] != want.level || got[i]["sandbox"] != "sb-1" || d["message"] != want.msg {
			t.Errorf("line %d: %v, want level %s naming sb-1 with the daemon's line %q whole", i, got[i], want.level, want.msg)
		}
	}
	if got[2]["level"] != "warn" || got[2]["output"] != "sandboxd: member: connect: nats: no servers available" {
		t.Errorf("the plain line: %v, want a warning with the line", got[2])
	}

	write(strings.Repeat("x", 3*initLogLine) + "\nafter\n")
	got = logged(t, &b)
	if len(got) != 2 || len(got[0]["output"].(string)) != initLogLine || got[0]["cut"] != true || got[1]["output"] != "after" {
		t.Errorf("an overlong line then a short one: %v", got)
	}
}

// What a sandbox writes past the minute's budget is dropped and counted,
// not logged: the workload may reach its daemon's output.
func TestInitOutputHasABudget(t *testing.T) {
	var b bytes.Buffer
	o := &Owner{log: zerolog.New(&b)}
	w := o.initOutput("sb-1").(*initLog)
	now := time.Unix(1000, 0)
	w.now = func() time.Time { return now }
	line := strings.Repeat("y", 1023) + "\n"
	for range 2 * initLogBudget / len(line) {
		_, _ = w.Write([]byte(line))
	}
	got := logged(t, &b)
	if want := initLogBudget / (len(line) - 1); len(got) != want {
		t.Errorf("%d lines logged in a minute, want the budget's %d", len(got), want)
	}
	now = now.Add(time.Minute)
	_, _ = w.Write([]byte("next\n"))
	got = logged(t, &b)
	if len(got) != 2 || got[0]["lines"] == nil || got[1]["output"] != "next" {
		t.Errorf("the next minute: %v, want the count of what was dropped, then the line", got)
	}
}
