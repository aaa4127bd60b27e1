package leak

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"go.uber.org/goleak"

	"github.com/stillpoint/stillpoint/internal/poll"
)

// Settle bounds how long Find waits for goroutines on their way out.
const Settle = 10 * time.Second

// Option changes what Find and VerifyTestMain report.
type Option struct {
	blockedForever string
	orphanedWrite  string
}

// IgnoreOrphanedPipeWrite ignores goroutines that run fn (anywhere in
// their stack, as stacks name it) while they block in a write to a
// net.Pipe: a library that dropped the pipe's reader leaves such a writer
// with nothing that can ever read or close it. A goroutine of fn blocked
// on anything else is still reported.
func IgnoreOrphanedPipeWrite(fn string) Option { return Option{orphanedWrite: fn} }

// IgnoreBlockedForever ignores goroutines whose innermost function is fn
// (as goroutine stacks name it, "pkg.(*T).method") while they block on a
// nil channel, which nothing can wake. fn blocked on anything else is
// still reported.
func IgnoreBlockedForever(fn string) Option { return Option{blockedForever: fn} }

// TestingM is what VerifyTestMain needs of testing.M.
type TestingM interface{ Run() int }

// VerifyTestMain runs the tests and, if they passed, fails the run (exit
// status 1, the leaked goroutines on stderr) when Find finds any.
func VerifyTestMain(m TestingM, opts ...Option) {
	code := m.Run()
	if code == 0 {
		if err := Find(opts...); err != nil {
			fmt.Fprintf(os.Stderr, "leak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Find returns an error naming the goroutines, other than the caller and
// those of package testing, that are still there after up to Settle.
func Find(opts ...Option) error { return find(Settle, opts) }

func find(settle time.Duration, opts []Option) error {
	var gopts []goleak.Option
	var forever, orphaned []string
	for _, o := range opts {
		if o.blockedForever != "" {
			forever = append(forever, o.blockedForever)
			gopts = append(gopts, goleak.IgnoreTopFunction(o.blockedForever))
		}
		if o.orphanedWrite != "" {
			orphaned = append(orphaned, o.orphanedWrite)
			gopts = append(gopts, goleak.IgnoreAnyFunction(o.orphanedWrite))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), settle)
	defer cancel()
	var err error
	// goleak.Find itself looks again for ~0.4 s each time.
	_ = poll.Until(ctx, poll.Every(100*time.Millisecond), func() (bool, error) {
		err = goleak.Find(gopts...)
		if err == nil {
			err = errors.Join(notForever(forever), notOrphaned(orphaned))
		}
		return err == nil, nil
	})
	return err
}

// notForever returns an error for goroutines whose innermost function is
// one of fns but which are not blocked on a nil channel: goleak was told
// to ignore them all.
func notForever(fns []string) error {
	if len(fns) == 0 {
		return nil
	}
	var bad []string
	for _, g := range stacks() {
		state, top := g.state, g.top
		for _, fn := range fns {
			if top == fn && !strings.HasPrefix(state, "chan receive (nil chan)") && !strings.HasPrefix(state, "chan send (nil chan)") {
				bad = append(bad, g.text)
			}
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("found unexpected goroutines:\n%s", strings.Join(bad, "\n\n"))
	}
	return nil
}

// pipeWrite is the innermost function of a goroutine blocked writing to a
// net.Pipe.
const pipeWrite = "net.(*pipe).write"

// notOrphaned returns an error for goroutines that run one of fns but are
// not blocked writing to a pipe: goleak was told to ignore them all.
func notOrphaned(fns []string) error {
	var bad []string
	for _, g := range stacks() {
		for _, fn := range fns {
			if strings.Contains(g.text, "\n"+fn+"(") && (g.top != pipeWrite || !strings.HasPrefix(g.state, "select")) {
				bad = append(bad, g.text)
			}
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("found unexpected goroutines:\n%s", strings.Join(bad, "\n\n"))
	}
	return nil
}

// goroutine is one goroutine of a full stack dump.
type goroutine struct {
	state string // "chan receive (nil chan)", maybe with ", 2 minutes"
	top   string // the innermost function, without its arguments
	text  string
}

// stacks returns every goroutine but the caller's.
func stacks() []goroutine {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []goroutine
	for i, text := range bytes.Split(buf, []byte("\n\n")) {
		if i == 0 {
			continue // the caller's own
		}
		lines := strings.SplitN(string(text), "\n", 3)
		if len(lines) < 2 {
			continue
		}
		head := lines[0] // goroutine 12 [chan receive (nil chan)]:
		open, end := strings.IndexByte(head, '['), strings.LastIndexByte(head, ']')
		if open < 0 || end < open {
			continue
		}
		top := lines[1]
		if p := strings.LastIndexByte(top, '('); p > 0 {
			top = top[:p]
		}
		out = append(out, goroutine{state: head[open+1 : end], top: top, text: string(text)})
	}
	return out
}
