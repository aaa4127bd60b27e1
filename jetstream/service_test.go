package jetstream_test

import (
	"errors"
	"testing"

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
