package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/timeline"
	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// screenshotEnv names the file TestTimelineHTMLOfTheDemoInChromium also
// copies its screenshot to: `make timeline-png` sets it to
// docs/timeline.png.
const screenshotEnv = "STILLPOINT_TIMELINE_PNG"

// TestTimelineHTMLOfTheDemoInChromium runs the demo, serves its store
// again, writes `stillpoint timeline --html` of its run and opens the page
// in headless Chromium: the DOM the page's script built has, for every
// operation, one row per member the model names (the rows exist only if
// the script ran), and a screenshot of it is a PNG.
func TestTimelineHTMLOfTheDemoInChromium(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.75, 30*time.Second)
	browser, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("this test opens the timeline in headless Chromium, which is not installed: apt-get install chromium")
	}
	b := buildBins(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()

	demo := child.StartForTest(t, child.Spec{Name: "demo", Path: b.stillpoint, Dir: "..", Args: []string{"demo", "--dir", dir}})
	if exit, err := demo.Wait(ctx); err != nil || !exit.Success() {
		t.Fatalf("demo: %v %v", exit, err)
	}
	srv := child.StartForTest(t, child.Spec{Name: "server", Path: b.stillpoint,
		Args: []string{"server", "--dir", filepath.Join(dir, "nats"), "--listen", "127.0.0.1:0"}})
	m, err := srv.WaitOutput(ctx, regexp.MustCompile(`NATS ready at (\S+)`))
	if err != nil {
		t.Fatal(err)
	}
	page := filepath.Join(dir, "timeline.html")
	stderr := &jstest.Buffer{}
	tl := child.StartForTest(t, child.Spec{Name: "timeline", Path: b.stillpoint, Stderr: stderr,
		Args: []string{"--nats-url", m[1], "timeline", "--run", "demo", "--json", "--html", page}})
	if exit, err := tl.Wait(ctx); err != nil || !exit.Success() {
		t.Fatalf("timeline: %v %v\n%s", exit, err, stderr.String())
	}
	var ops []timeline.Op
	dec := json.NewDecoder(strings.NewReader(tl.Output()))
	for dec.More() {
		var op timeline.Op
		if err := dec.Decode(&op); err != nil {
			t.Fatalf("timeline --json: %v", err)
		}
		ops = append(ops, op)
	}
	kinds := map[timeline.Kind]int{}
	for _, op := range ops {
		kinds[op.Kind]++
	}
	if kinds[timeline.KindCheckpoint] != 3 || kinds[timeline.KindRestore] != 1 || kinds[timeline.KindRelease] == 0 {
		t.Fatalf("the demo's timeline has %v operations, want 3 checkpoints, a restore and releases", kinds)
	}

	dom := runBrowser(ctx, t, browser, "--dump-dom", "file://"+page)
	if !strings.Contains(dom, `data-rendered="`+strconv.Itoa(len(ops))+`"`) {
		t.Fatalf("the page's script did not finish drawing %d operations; the DOM:\n%.4000s", len(ops), dom)
	}
	sections := strings.Split(dom, `<section class="op" data-op="`)[1:]
	if len(sections) != len(ops) {
		t.Fatalf("%d operation sections in the DOM, want %d", len(sections), len(ops))
	}
	for i, op := range ops {
		sec := sections[i]
		if !strings.HasPrefix(sec, op.ID+`"`) {
			t.Errorf("section %d is not %s", i, op.ID)
			continue
		}
		rows := strings.Count(sec, `class="member-row"`)
		if rows != len(op.Members) {
			t.Errorf("%s: %d member rows in the DOM, want %d", op.ID, rows, len(op.Members))
		}
		for _, mb := range op.Members {
			if !strings.Contains(sec, `class="member-row" data-member="`+string(mb)+`"`) {
				t.Errorf("%s: no row for %s in the DOM", op.ID, mb)
			}
		}
		bars := strings.Count(sec, `<rect class="bar `)
		want := 0
		for _, p := range op.Phases {
			want += len(p.Acks)
		}
		if bars != want {
			t.Errorf("%s: %d bars, want one per ack or missing ack (%d)", op.ID, bars, want)
		}
	}

	shot := filepath.Join(dir, "timeline.png")
	runBrowser(ctx, t, browser, "--screenshot="+shot, "--window-size=1400,900", "--hide-scrollbars", "file://"+page)
	png, err := os.ReadFile(shot)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) || len(png) < 10000 {
		t.Fatalf("the screenshot is not a PNG of a page (%d bytes)", len(png))
	}
	if to := os.Getenv(screenshotEnv); to != "" {
		if err := os.WriteFile(to, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote the screenshot to %s", to)
	}
}

// runBrowser runs headless Chromium with args and returns its stdout.
func runBrowser(ctx context.Context, t *testing.T, browser string, args ...string) string {
	t.Helper()
	stderr := &jstest.Buffer{}
	home := t.TempDir()
	p := child.StartForTest(t, child.Spec{Name: "chromium", Path: browser, Stderr: stderr, Env: []string{"HOME=" + home},
		Args: append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir=" + filepath.Join(home, "profile")}, args...)})
	if exit, err := p.Wait(ctx); err != nil || !exit.Success() {
		t.Fatalf("chromium %v: %v %v\n%s", args, exit, err, stderr.String())
	}
	return p.Output()
}
