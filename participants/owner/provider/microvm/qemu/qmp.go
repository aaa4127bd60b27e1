package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
)

// ErrQMP is returned (wrapped, with QEMU's class and description) for a
// QMP command that QEMU refused.
var ErrQMP = errors.New("microvm: qmp command failed")

// QMP is a client of one QEMU's monitor socket: JSON objects one a line,
// a command {"execute", "arguments", "id"} answered by {"return"} or
// {"error"} with the same id, and asynchronous {"event"} lines between.
// Commands run one at a time.
type QMP struct {
	mu   sync.Mutex
	conn net.Conn
	r    *bufio.Reader
	next uint64
}

// DialQMP connects to the socket at path (waiting for QEMU to create it,
// until ctx ends), reads the greeting and leaves the capabilities
// negotiation mode.
func DialQMP(ctx context.Context, path string) (*QMP, error) {
	var conn net.Conn
	err := poll.Until(ctx, poll.Backoff(2*time.Millisecond, 50*time.Millisecond), func() (bool, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "unix", path)
		if err != nil {
			return false, nil
		}
		conn = c
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", path, err)
	}
	q := &QMP{conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}
	if _, err := q.readLine(ctx); err != nil { // {"QMP": {...}}
		conn.Close()
		return nil, fmt.Errorf("qmp %s: greeting: %w", path, err)
	}
	if err := q.Do(ctx, "qmp_capabilities", nil, nil); err != nil {
		conn.Close()
		return nil, err
	}
	return q, nil
}

// Close closes the connection.
func (q *QMP) Close() error { return q.conn.Close() }

type qmpLine struct {
	ID     *uint64         `json:"id"`
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Event string `json:"event"`
}

func (q *QMP) readLine(ctx context.Context) (qmpLine, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = q.conn.SetReadDeadline(dl)
	} else {
		_ = q.conn.SetReadDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { _ = q.conn.SetReadDeadline(time.Now()) })
	defer stop()
	b, err := q.r.ReadBytes('\n')
	if err != nil {
		if ctx.Err() != nil {
			return qmpLine{}, ctx.Err()
		}
		return qmpLine{}, err
	}
	var l qmpLine
	if err := json.Unmarshal(b, &l); err != nil {
		return qmpLine{}, fmt.Errorf("qmp: bad line %q: %w", b, err)
	}
	return l, nil
}

// Do runs command with args (nil for none) and decodes its return value
// into out (nil to drop it).
func (q *QMP) Do(ctx context.Context, command string, args, out any) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.next++
	id := q.next
	msg := map[string]any{"execute": command, "id": id}
	if args != nil {
		msg["arguments"] = args
	}
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	// Set or cleared: a deadline left from an earlier call would fail this
	// write once it passed (a snapshot minutes after the start).
	dl, _ := ctx.Deadline()
	_ = q.conn.SetWriteDeadline(dl)
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("qmp %s: %w", command, err)
	}
	for {
		l, err := q.readLine(ctx)
		if err != nil {
			return fmt.Errorf("qmp %s: %w", command, err)
		}
		if l.Event != "" || l.ID == nil || *l.ID != id {
			continue
		}
		if l.Error != nil {
			return fmt.Errorf("%w: %s: %s: %s", ErrQMP, command, l.Error.Class, l.Error.Desc)
		}
		if out != nil && len(l.Return) > 0 {
			return json.Unmarshal(l.Return, out)
		}
		return nil
	}
}

// Status returns the VM's run state (query-status): "running", "paused",
// "inmigrate", "postmigrate", ...
func (q *QMP) Status(ctx context.Context) (string, error) {
	var st struct {
		Status string `json:"status"`
	}
	err := q.Do(ctx, "query-status", nil, &st)
	return st.Status, err
}

// MigrationInfo is what query-migrate reports.
type MigrationInfo struct {
	Status string `json:"status"`
	RAM    struct {
		Transferred int64 `json:"transferred"`
		Total       int64 `json:"total"`
	} `json:"ram"`
	Downtime  int64  `json:"downtime"`
	ErrorDesc string `json:"error-desc"`
}

// WaitMigration polls query-migrate until the migration completed (its
// info) or failed (an error).
func (q *QMP) WaitMigration(ctx context.Context) (MigrationInfo, error) {
	var info MigrationInfo
	err := poll.Until(ctx, poll.Backoff(time.Millisecond, 20*time.Millisecond), func() (bool, error) {
		info = MigrationInfo{}
		if err := q.Do(ctx, "query-migrate", nil, &info); err != nil {
			return false, err
		}
		switch info.Status {
		case "completed":
			return true, nil
		case "failed", "cancelled":
			return false, fmt.Errorf("%w: migration %s: %s", ErrQMP, info.Status, info.ErrorDesc)
		}
		return false, nil
	})
	return info, err
}

// WaitStatus polls query-status until the run state is not from (e.g.
// an incoming migration left "inmigrate") and returns it.
func (q *QMP) WaitStatus(ctx context.Context, from string) (string, error) {
	var st string
	err := poll.Until(ctx, poll.Backoff(time.Millisecond, 20*time.Millisecond), func() (bool, error) {
		s, err := q.Status(ctx)
		st = s
		return err == nil && s != from, err
	})
	return st, err
}

// SetIgnoreShared sets the x-ignore-shared migration capability: RAM in a
// shared memory backend is not sent (the template's RAM file holds it).
func (q *QMP) SetIgnoreShared(ctx context.Context, on bool) error {
	return q.Do(ctx, "migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": on}}}, nil)
}

// SetFastMigration lifts the bandwidth limit and allows any downtime: the
// VM is stopped while it migrates, so all of it goes in one pass.
func (q *QMP) SetFastMigration(ctx context.Context) error {
	return q.Do(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40, "downtime-limit": 100000}, nil)
}

// SaveURI is the migration URI that writes the stream to the file at path
// (QEMU 7.2 has no file: URI; its exec: runs the command with /bin/sh).
func SaveURI(path string) string { return "exec:cat > " + shellQuote(path) }

// LoadURI is the incoming migration URI that reads the file at path.
func LoadURI(path string) string { return "exec:cat " + shellQuote(path) }

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
