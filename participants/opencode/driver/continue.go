package driver

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"regexp"
	"slices"
	"syscall"
	"time"
)

// ServerUser is the user name of `opencode serve`'s basic auth.
const ServerUser = "opencode"

// listening is the line `opencode serve` prints once it listens.
var listening = regexp.MustCompile(`listening on (http://[0-9.]+:[0-9]+)`)

// serveWait bounds how long the server may take to listen: long enough
// for OpenCode's start on a busy machine (seconds of CPU, much longer in
// wall time when the cores are shared), short of the launch's own bound,
// which ends a wedged start in any case. A server that exits fails the
// continuation at once.
const serveWait = 5 * time.Minute

// server is a running `opencode serve` of the session folder.
type server struct {
	base     string
	password string
	dir      string
	client   *http.Client
	cmd      *exec.Cmd
	cancel   context.CancelFunc // kills the process
	waited   chan error         // its end, once
	stopped  bool
}

// Continue continues the saved session with no new user turn: it starts
// `opencode serve` on a loopback port of its choosing (a password of its
// own, so no other process of the host can drive it), reads the session's
// messages, posts a message with no parts (OpenCode stores an empty user
// message, which the model never sees, and runs the agent loop again on
// the session as it is: a tool call a crash interrupted comes back to the
// model as interrupted), reads the messages again and stops the server.
// The user turns with content must be exactly the ones before, or the
// summary says they changed. A session whose last step already answered
// (answer) is not continued: its answer is the summary, and no model call
// is made.
func Continue(ctx context.Context, c Config, stdout, stderr io.Writer) (Summary, error) {
	sum := Summary{Kind: SummaryKind, Continued: true}
	if err := c.Validate(true); err != nil {
		return sum, err
	}
	if err := c.prepare(); err != nil {
		return sum, err
	}
	id, err := c.findSession(ctx, stderr)
	if err != nil {
		return sum, err
	}
	if id == "" {
		return sum, errors.New("no saved session to continue")
	}
	srv, err := c.serve(ctx, stderr)
	if err != nil {
		return sum, err
	}
	defer srv.stop()
	before, err := srv.messages(ctx, id)
	if err != nil {
		return sum, err
	}
	if s, ok := answer(before); ok {
		s.Kind, s.Session, s.Continued, s.UserTurns = SummaryKind, id, true, len(UserTurns(before))
		how := ""
		if unmarkedAnswer(before[len(before)-1]) {
			how = " (its answer arrived whole, but OpenCode had not marked the step finished)"
		}
		fmt.Fprintf(stderr, "opencode-driver: session %s already answered%s; nothing to continue\n", id, how)
		return s, nil
	}
	if err := srv.post(ctx, id); err != nil {
		if ctx.Err() != nil {
			return sum, fmt.Errorf("interrupted: %w", context.Cause(ctx))
		}
		sum.Session, sum.Error = id, err.Error()
		return sum, nil
	}
	after, err := srv.messages(ctx, id)
	if err != nil {
		return sum, err
	}
	added := after[min(len(before), len(after)):]
	for _, m := range added {
		b, _ := json.Marshal(m)
		_, _ = fmt.Fprintf(stdout, "%s\n", b)
	}
	s := summarise(added)
	s.Kind, s.Session, s.Continued = SummaryKind, id, true
	was, is := UserTurns(before), UserTurns(after)
	s.UserTurns = len(is)
	if !slices.Equal(was, is) {
		msg := fmt.Sprintf("the saved user turns changed: %d before, %d after", len(was), len(is))
		if s.Error != "" {
			msg += "; " + s.Error
		}
		s.Error = msg
	}
	return s, nil
}

// answer returns the summary of a session whose last message is the
// model's answer, and whether it is: a step that finished with "stop", or
// an answer OpenCode had not marked finished (unmarkedAnswer). Such a
// session is not continued: OpenCode's agent loop would send the answer
// back and ask the model for a turn after it.
func answer(msgs []Message) (Summary, bool) {
	if len(msgs) == 0 {
		return Summary{}, false
	}
	m := msgs[len(msgs)-1]
	if m.Info.Role != "assistant" || m.Info.Error != nil || m.text() == "" || finish(m) != "stop" {
		return Summary{}, false
	}
	return summarise(msgs[lastUser(msgs)+1:]), true
}

func lastUser(msgs []Message) int {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Info.Role == "user" {
			return i
		}
	}
	return -1
}

// serve starts `opencode serve` and waits until it listens. The caller
// stops it (server.stop).
func (c Config) serve(ctx context.Context, stderr io.Writer) (*server, error) {
	pw := make([]byte, 16)
	_, _ = rand.Read(pw)
	sctx, cancel := context.WithCancel(ctx)
	s := &server{password: hex.EncodeToString(pw), dir: c.Workdir, client: &http.Client{}, cancel: cancel, waited: make(chan error, 1)}
	s.cmd = c.command(sctx, []string{"OPENCODE_SERVER_PASSWORD=" + s.password}, "serve", "--port", "0", "--hostname", "127.0.0.1")
	s.cmd.Stderr = stderr
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("start %s serve: %w", c.OpenCode, err)
	}
	// One goroutine copies the server's output (to stderr, for the launch
	// log) until it closes, then waits for the process: stop waits for it.
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			fmt.Fprintln(stderr, sc.Text())
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case urls <- m[1]:
				default:
				}
			}
		}
		s.waited <- s.cmd.Wait()
	}()
	t := time.NewTimer(serveWait)
	defer t.Stop()
	select {
	case s.base = <-urls:
		return s, nil
	case err := <-s.waited:
		s.stopped = true
		cancel()
		return nil, fmt.Errorf("opencode serve ended before it listened: %s", exitText(err))
	case <-t.C:
		s.stop()
		return nil, fmt.Errorf("opencode serve did not listen within %s", serveWait)
	case <-ctx.Done():
		s.stop()
		return nil, fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
}

// stop ends the server, SIGTERM then SIGKILL after 10 s, and waits for it
// and for the goroutine that waits for it. It may be called more than
// once.
func (s *server) stop() {
	if s.stopped {
		return
	}
	s.stopped = true
	defer s.cancel()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-s.waited:
	case <-t.C:
		s.cancel() // SIGKILL
		<-s.waited
	}
}

func (s *server) do(ctx context.Context, method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.base+path+"?directory="+url.QueryEscape(s.dir), rd)
	if err != nil {
		return err
	}
	req.SetBasicAuth(ServerUser, s.password)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := clip(string(b), 500)
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: the answer does not decode: %w", method, path, err)
		}
	}
	return nil
}

// messages returns the session's messages with their parts.
func (s *server) messages(ctx context.Context, id string) ([]Message, error) {
	var msgs []Message
	err := s.do(ctx, http.MethodGet, "/session/"+url.PathEscape(id)+"/message", nil, &msgs)
	return msgs, err
}

// post sends the message with no parts and waits for the agent loop to
// end (the server answers with the last assistant message).
func (s *server) post(ctx context.Context, id string) error {
	return s.do(ctx, http.MethodPost, "/session/"+url.PathEscape(id)+"/message", map[string]any{"parts": []any{}}, nil)
}
