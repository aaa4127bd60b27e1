package qemu

import (
	"bufio"
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/sandboxd/vmctl"
)

// TestControlIDsDifferAcrossConnections: two connections to a guest (the
// original's and a fork's, a dead owner's and its successor's) do not
// number their requests alike, so that an answer owed to the first never
// matches a request of the second.
func TestControlIDsDifferAcrossConnections(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "c")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	firstID := func() uint64 {
		ids := make(chan uint64, 1)
		go func() { // a guest that answers one request and hangs up
			conn, err := l.Accept()
			if err != nil {
				ids <- 0
				return
			}
			defer conn.Close()
			line, err := bufio.NewReader(conn).ReadBytes('\n')
			if err != nil {
				ids <- 0
				return
			}
			req, _ := vmctl.DecodeRequest(line)
			b, _ := vmctl.Encode(vmctl.Response{ID: req.ID, OK: true})
			_, _ = conn.Write(b)
			ids <- req.ID
		}()
		c, err := DialControl(ctx, sock, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Call(ctx, vmctl.Request{Op: vmctl.OpSync}); err != nil {
			t.Fatal(err)
		}
		return <-ids
	}
	a, b := firstID(), firstID()
	if a == 0 || a == b {
		t.Fatalf("the first requests of two connections have ids %d and %d", a, b)
	}
}
