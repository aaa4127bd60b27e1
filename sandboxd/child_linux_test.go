package sandboxd

import (
	"context"
	"io"
	"os"
	"testing"
	"time"
)

func TestStartChildWaitsThroughTheReapLoop(t *testing.T) {
	if _, err := StartChild(ChildSpec{Argv: []string{"true"}}); err == nil {
		t.Fatal("StartChild without the reap loop: no error")
	}
	release, err := HoldReaper()
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	c, err := StartChild(ChildSpec{Argv: []string{"sh", "-c", "echo out; exit 3"}, Files: [3]*os.File{nil, w, nil}})
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(r)
	r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, sig, err := c.Wait(ctx)
	if err != nil || code != 3 || sig != "" || string(out) != "out\n" {
		t.Fatalf("exit %d %q %v, output %q", code, sig, err, out)
	}
	// A second Wait returns the same exit.
	if code, _, err := c.Wait(ctx); err != nil || code != 3 {
		t.Fatalf("second wait: %d %v", code, err)
	}
	k, err := StartChild(ChildSpec{Argv: []string{"sleep", "60"}, Setsid: true})
	if err != nil {
		t.Fatal(err)
	}
	k.Kill()
	if code, sig, err := k.Wait(ctx); err != nil || code != -1 || sig != "SIGKILL" {
		t.Fatalf("killed: %d %q %v", code, sig, err)
	}
}
