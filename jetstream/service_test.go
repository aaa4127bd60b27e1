package jetstream_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// A JSON endpoint answers, refuses a bad body naming it, maps errors to a
// ServiceError, and Stop waits for it.
func TestService(t *testing.T) {
	env := jstest.Start(t, jstest.WithoutProvision())
	classify := func(err error) (int, string) {
		if errors.Is(err, jetstream.ErrBadRequest) {
			return 400, "bad_request"
		}
		return 500, "internal"
	}
	s, err := jetstream.NewService(env.Conn, micro.Config{Name: "test", Version: "1.0.0"}, "spsvc.t", classify)
	if err != nil {
		t.Fatal(err)
	}
	type in struct{ N int }
	if err := s.Handle("double", func(body []byte) (any, error) {
		var r in
		if err := jetstream.DecodeRequest(body, &r); err != nil {
			return nil, err
		}
		if r.N < 0 {
			return nil, errors.New("negative")
		}
		return map[string]int{"n": 2 * r.N}, nil
	}); err != nil {
		t.Fatal(err)
	}
	var out map[string]int
	if err := jetstream.Call(t.Context(), env.Conn, "spsvc.t.double", in{N: 21}, &out); err != nil || out["n"] != 42 {
		t.Fatalf("call: %v %v", out, err)
	}
	var se *jetstream.ServiceError
	if err := jetstream.Call(t.Context(), env.Conn, "spsvc.t.double", map[string]int{"M": 1}, &out); !errors.As(err, &se) || se.Status != 400 || se.Code != "bad_request" {
		t.Fatalf("unknown field: %v", err)
	}
	if err := jetstream.Call(t.Context(), env.Conn, "spsvc.t.double", in{N: -1}, &out); !errors.As(err, &se) || se.Status != 500 || se.Detail != "negative" {
		t.Fatalf("handler error: %v (%+v)", err, se)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := jetstream.Call(t.Context(), env.Conn, "spsvc.t.double", in{N: 1}, &out); err == nil {
		t.Fatal("a stopped service answered")
	}
}

// An error answer carries the body SetErrorBody makes, on both kinds of
// endpoint, and its description header stays on one line when the error
// has several (a joined validation error).
func TestServiceErrorBody(t *testing.T) {
	env := jstest.Start(t, jstest.WithoutProvision())
	s, err := jetstream.NewService(env.Conn, micro.Config{Name: "test-body", Version: "1.0.0"}, "spsvc.b",
		func(error) (int, string) { return 409, "conflict" })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	s.SetErrorBody(func(status int, code string, err error) []byte {
		return []byte(fmt.Sprintf(`{"status":%d,"code":%q,"detail":%q}`, status, code, err.Error()))
	})
	fail := errors.Join(errors.New("first"), errors.New("second"))
	if err := s.Handle("sync", func([]byte) (any, error) { return nil, fail }); err != nil {
		t.Fatal(err)
	}
	if err := s.HandleAsync(t.Context(), "async", func(context.Context, []byte) (any, error) { return nil, fail }); err != nil {
		t.Fatal(err)
	}
	for _, ep := range []string{"sync", "async"} {
		m, err := env.Conn.RequestWithContext(t.Context(), "spsvc.b."+ep, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Header.Get(micro.ErrorCodeHeader); got != "409" {
			t.Errorf("%s: code header %q", ep, got)
		}
		if got := m.Header.Get(micro.ErrorHeader); got != "conflict: first; second" {
			t.Errorf("%s: description header %q, want one line", ep, got)
		}
		if want := `{"status":409,"code":"conflict","detail":"first\nsecond"}`; string(m.Data) != want {
			t.Errorf("%s: body %s, want %s", ep, m.Data, want)
		}
		var se *jetstream.ServiceError
		if err := jetstream.Call(t.Context(), env.Conn, "spsvc.b."+ep, nil, &struct{}{}); !errors.As(err, &se) || se.Status != 409 || se.Code != "conflict" {
			t.Errorf("%s: Call: %v", ep, err)
		}
	}
}

// An answer over the server's max payload is answered as an error, not
// dropped: the caller would otherwise wait for it until its deadline.
func TestServiceAnswerTooLarge(t *testing.T) {
	env := jstest.Start(t, jstest.WithoutProvision())
	s, err := jetstream.NewService(env.Conn, micro.Config{Name: "test-large", Version: "1.0.0"}, "spsvc.l",
		func(error) (int, string) { return 500, "internal" })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	big := strings.Repeat("x", int(env.Conn.MaxPayload()))
	if err := s.HandleAsync(t.Context(), "big", func(context.Context, []byte) (any, error) { return big, nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.Handle("bigsync", func([]byte) (any, error) { return big, nil }); err != nil {
		t.Fatal(err)
	}
	for _, ep := range []string{"big", "bigsync"} {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		var se *jetstream.ServiceError
		var out string
		if err := jetstream.Call(ctx, env.Conn, "spsvc.l."+ep, nil, &out); !errors.As(err, &se) || se.Status != 500 || !strings.Contains(se.Detail, "payload") {
			t.Errorf("%s: an answer over the max payload: %v", ep, err)
		}
		cancel()
	}
}
