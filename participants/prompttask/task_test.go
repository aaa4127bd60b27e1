package prompttask_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stillpoint/stillpoint/participants/prompttask"
)

// A task needs a prompt; the rest of the payload is the owner's.
func TestParse(t *testing.T) {
	tk, err := prompttask.Parse(json.RawMessage(`{"task":"fix-add","prompt":"Make test.sh pass.","files":{"a":"b"}}`))
	if err != nil || tk.Name != "fix-add" || tk.Prompt != "Make test.sh pass." {
		t.Fatalf("%+v %v", tk, err)
	}
	// A SWE-bench instance's problem statement is its prompt.
	if tk, err = prompttask.Parse(json.RawMessage(`{"instance_id":"a__b-1","problem_statement":"It breaks."}`)); err != nil || tk.Prompt != "It breaks." {
		t.Fatalf("a SWE-bench instance: %+v %v", tk, err)
	}
	for _, bad := range []string{`{"task":"t"}`, `{"problem_statement":" "}`, `{"prompt":" "}`, `[]`, `{"prompt":"p","task":"a\nb"}`, `{"prompt":"a\u0000b"}`} {
		if _, err := prompttask.Parse(json.RawMessage(bad)); !errors.Is(err, prompttask.ErrTask) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}
