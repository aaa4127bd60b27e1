package bridge

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"reflect"
	"testing"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
)

// FuzzDecodeRequest: a request body of any bytes, for each of the API's
// request types, never panics the decoder or the validation; it is
// accepted or refused as a bad request (or too large), and what it
// accepts re-encodes to a body that decodes to the same request.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"checkpoint_id":"c1","episodes":["r1","r2-a3"],"stop":true,"timeout_ms":5000}`,
		`{"checkpoint_id":"c1","hold":true}`,
		`{"stop":true}`,
		`{"source_checkpoint_id":"c1","restore_id":"restore-e2"}`,
		`{"episodes":["r1-a1"]}`,
		`{"rollouts":["r1"]}`,
		`{"keep":["c1"],"keep_latest":2}`,
		`{"checkpoint_id":"x"} {}`,
		`{"checkpointid":"x"}`,
		`{"episodes":[`,
		``,
	} {
		for kind := range uint8(6) {
			f.Add(kind, []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, kind uint8, body []byte) {
		var v any
		switch kind % 6 {
		case 0:
			v = &bridgeapi.CheckpointRequest{}
		case 1:
			v = &bridgeapi.CommitRequest{}
		case 2:
			v = &bridgeapi.RestoreRequest{}
		case 3:
			v = &bridgeapi.RetireRequest{}
		case 4:
			v = &bridgeapi.ForgetRequest{}
		default:
			v = &bridgeapi.ReleaseRequest{}
		}
		err := decode(httptest.NewRequest("POST", "/v1/x", bytes.NewReader(body)), v)
		if err != nil {
			if !errors.Is(err, bridgeapi.ErrBadRequest) && !errors.Is(err, bridgeapi.ErrTooLarge) {
				t.Fatalf("refused with %v, neither a bad request nor too large", err)
			}
			return
		}
		switch r := v.(type) {
		case *bridgeapi.CheckpointRequest:
			checkBad(t, r.Validate())
		case *bridgeapi.RestoreRequest:
			checkBad(t, r.Validate())
		case *bridgeapi.RetireRequest:
			_, err := r.Parse()
			checkBad(t, err)
		case *bridgeapi.ForgetRequest:
			checkBad(t, r.Validate())
		case *bridgeapi.ReleaseRequest:
			checkBad(t, r.Validate())
		}
		again, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("an accepted request does not re-encode: %v", err)
		}
		back := reflect.New(reflect.TypeOf(v).Elem()).Interface()
		if err := decode(httptest.NewRequest("POST", "/v1/x", bytes.NewReader(again)), back); err != nil {
			t.Fatalf("an accepted request re-encoded is refused: %v\n%s", err, again)
		}
		if again2, _ := json.Marshal(back); !bytes.Equal(again, again2) {
			t.Fatalf("a round trip changed the request:\n%s\n%s", again, again2)
		}
	})
}

// checkBad fails the test for a validation error that is not a bad
// request.
func checkBad(t *testing.T, err error) {
	t.Helper()
	if err != nil && !errors.Is(err, bridgeapi.ErrBadRequest) {
		t.Fatalf("validation error %v is not a bad request", err)
	}
}
