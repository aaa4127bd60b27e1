package agent

import (
	"errors"
	"strings"
	"testing"
)

func TestDecodeBookmark(t *testing.T) {
	ok := []string{
		`{"v":1,"next":"seed","rollout":"r1","attempt":0,"task":{}}`,
		`{"v":1,"next":"harness","rollout":"r1","attempt":2,"task":{},"session":"r1","state":{"data_dir":"/d"},"resume":true,"future_field":1}`,
		`{"v":1,"next":"verify","rollout":"r1","attempt":0,"task":{},"session":"r1"}`,
		`{"v":1,"next":"return","rollout":"r1","attempt":0,"task":{},"result":{"rollout_id":"r1","attempt":0,"episode":"r1","adapter":"scripted","launches":[]}}`,
	}
	for _, s := range ok {
		if _, err := DecodeBookmark([]byte(s)); err != nil {
			t.Errorf("DecodeBookmark(%s): %v", s, err)
		}
	}
	bad := []struct{ in, want string }{
		{``, "not a JSON object"},
		{`[1]`, "not a JSON object"},
		{`{"next":"seed","rollout":"r1"}`, `no version field "v"`},
		{`{"v":2,"next":"seed","rollout":"r1"}`, "version 2"},
		{`{"v":"1","next":"seed","rollout":"r1"}`, "cannot unmarshal"},
		{`{"v":1,"next":"launch","rollout":"r1"}`, `unknown stage "launch"`},
		{`{"v":1,"next":"harness","rollout":"r1"}`, "bookmark.session: required at stage harness"},
		{`{"v":1,"next":"harness","rollout":"r1","session":"r1"}`, "bookmark.state: required"},
		{`{"v":1,"next":"return","rollout":"r1"}`, "bookmark.result: required"},
		{`{"v":1,"next":"seed","rollout":"../etc"}`, "bookmark.rollout"},
		{`{"v":1,"next":"verify","rollout":"r1","session":"a b"}`, "bookmark.session"},
		{`{"v":1,"next":"seed","rollout":"r1","attempt":-1}`, "bookmark.attempt"},
		{`{"v":1,"next":"seed","rollout":"r1"`, "unexpected end"},
	}
	for _, c := range bad {
		_, err := DecodeBookmark([]byte(c.in))
		if !errors.Is(err, ErrBadBookmark) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("DecodeBookmark(%s) = %v, want ErrBadBookmark naming %q", c.in, err, c.want)
		}
	}
}
