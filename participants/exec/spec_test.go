package exec

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/participants/exec/example"
	"github.com/stillpoint/stillpoint/sandboxd/relay"
)

// minimal is the smallest spec that parses; the bad specs are edits of it.
const minimal = `{"launch": {"argv": ["h", "{prompt}"]}, "continue": "never", "answer": "last_line"}`

func TestParseTheExampleSpec(t *testing.T) {
	dir := t.TempDir()
	file, err := example.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := LoadSpec(file)
	if err != nil {
		t.Fatal(err)
	}
	if s.Continue == nil || len(s.Check) == 0 || s.AnswerFile != "answer.txt" || !s.Pause || s.SessionRoot != DefaultSessionRoot {
		t.Fatalf("spec %+v", s)
	}
	// continue's environment is launch's: it calls the same model.
	var names []string
	for _, v := range s.Continue.Env {
		names = append(names, v.Name)
	}
	if got := strings.Join(names, " "); got != "HOME PYTHONDONTWRITEBYTECODE STILLPOINT_EPISODE STILLPOINT_MODEL_URL STILLPOINT_TASK" {
		t.Fatalf("continue's environment %s", got)
	}
	if s.Dir.String() != "{workdir}" {
		t.Fatalf("dir %q", s.Dir)
	}
}

func TestParseSpecDefaultsAndOptions(t *testing.T) {
	s, err := ParseSpec("m.json", []byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	if s.Continue != nil || s.Check != nil || s.AnswerFile != "" || !s.Pause {
		t.Fatalf("minimal spec %+v", s)
	}
	s, err = ParseSpec("o.json", []byte(`{"launch": {"argv": ["h"], "env": {"P": "{prompt}", "PATH": "/x"}},
		"continue": {"argv": ["h", "--continue"], "env": {"P": "again", "Q": "{session}"}},
		"check": {"argv": ["h", "--check"]}, "answer": {"file": "./out/answer"}, "pause": false,
		"session_root": "/data/h/", "dir": "{session}"}`))
	if err != nil {
		t.Fatal(err)
	}
	if s.Pause || s.SessionRoot != "/data/h" || s.AnswerFile != "out/answer" || s.Dir.String() != "{session}" {
		t.Fatalf("spec %+v", s)
	}
	got := ""
	for _, v := range s.Continue.Env {
		got += v.Name + "=" + v.Value.String() + " "
	}
	if got != "P=again PATH=/x Q={session} " {
		t.Fatalf("continue's environment %q: want its own over launch's", got)
	}
}

// TestRelayEditsReachTheLaunch: the relay edits a spec's continue names
// are the continuation's, and the first launch has none.
func TestRelayEditsReachTheLaunch(t *testing.T) {
	relay.Register(relay.Edit{Name: "exec-spec-test", Apply: func(_ string, b []byte) ([]byte, []json.RawMessage, error) { return b, nil, nil }})
	s, err := ParseSpec("e.json", []byte(`{"launch": {"argv": ["h", "{prompt}"]},
		"continue": {"argv": ["h", "--continue"], "relay_edits": ["exec-spec-test"]},
		"check": {"argv": ["c"]}, "answer": "last_line"}`))
	if err != nil {
		t.Fatal(err)
	}
	if s.Launch.RelayEdits != nil || !slices.Equal(s.Continue.RelayEdits, []string{"exec-spec-test"}) {
		t.Fatalf("launch edits %v, continue edits %v", s.Launch.RelayEdits, s.Continue.RelayEdits)
	}
}

func TestTemplates(t *testing.T) {
	vals := map[string]string{"prompt": `say "hi" {x}`, "session": "/s"}
	for _, c := range []struct{ in, want string }{
		{"{prompt}", `say "hi" {x}`},
		{"--prompt={prompt}", `--prompt=say "hi" {x}`},
		{"{session}/answer", "/s/answer"},
		{"{{literal}} {{{session}}}", "{literal} {/s}"},
		{"no placeholders", "no placeholders"},
		{"", ""},
	} {
		tm, err := ParseTemplate(c.in)
		if err != nil {
			t.Fatalf("%q: %v", c.in, err)
		}
		if got := tm.Expand(vals); got != c.want {
			t.Errorf("%q expands to %q, want %q", c.in, got, c.want)
		}
	}
	for _, c := range []struct{ in, want string }{
		{"{promt}", "unknown placeholder {promt}"},
		{"{PROMPT}", "unknown placeholder {PROMPT}"},
		{"{}", "unknown placeholder {}"},
		{"{prompt", "a { with no }"},
		{"prompt}", "a } with no {"},
	} {
		if _, err := ParseTemplate(c.in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.in, err, c.want)
		}
	}
}

// TestBadSpecs: every refusal names the file and the field, and says
// what is wrong.
func TestBadSpecs(t *testing.T) {
	for _, c := range []struct{ name, spec, want string }{
		{"not JSON", `{"launch": `, "bad.json: the spec: unexpected EOF"},
		{"not an object", `[]`, "bad.json: the spec: a JSON array"},
		{"unknown top field", `{"launch": {"argv": ["h", "{prompt}"]}, "continue": "never", "answer": "last_line", "resume": 1}`,
			`bad.json: resume: unknown field (known in the spec: launch, continue, check, answer, pause, session_root, dir)`},
		{"unknown launch field", `{"launch": {"argv": ["h", "{prompt}"], "cwd": "/"}, "continue": "never", "answer": "last_line"}`,
			"bad.json: launch.cwd: unknown field (known in launch: argv, env, relay_edits)"},
		{"unknown answer field", `{"launch": {"argv": ["h", "{prompt}"]}, "continue": "never", "answer": {"path": "a"}}`,
			"bad.json: answer.path: unknown field"},
		{"no launch", `{"continue": "never", "answer": "last_line"}`, "bad.json: launch: required"},
		{"no argv", `{"launch": {"env": {"P": "{prompt}"}}, "continue": "never", "answer": "last_line"}`, "bad.json: launch.argv: required"},
		{"empty argv", `{"launch": {"argv": []}, "continue": "never", "answer": "last_line"}`, "bad.json: launch.argv: empty"},
		{"argv not strings", `{"launch": {"argv": ["h", 1]}, "continue": "never", "answer": "last_line"}`, "bad.json: launch.argv: a JSON number, want string"},
		{"null argv", `{"launch": {"argv": null}, "continue": "never", "answer": "last_line"}`, "bad.json: launch.argv: null"},
		{"unknown placeholder", `{"launch": {"argv": ["h", "{promt}"]}, "continue": "never", "answer": "last_line"}`,
			`bad.json: launch.argv[1]: "{promt}": unknown placeholder {promt}`},
		{"unknown placeholder in env", `{"launch": {"argv": ["h", "{prompt}"], "env": {"URL": "{model}"}}, "continue": "never", "answer": "last_line"}`,
			`bad.json: launch.env.URL: "{model}": unknown placeholder {model}`},
		{"bad env name", `{"launch": {"argv": ["h", "{prompt}"], "env": {"A=B": "x"}}, "continue": "never", "answer": "last_line"}`,
			`bad.json: launch.env: "A=B" is no variable name`},
		{"no prompt", `{"launch": {"argv": ["h"]}, "continue": "never", "answer": "last_line"}`, "bad.json: launch: no {prompt}"},
		{"no continue", `{"launch": {"argv": ["h", "{prompt}"]}, "answer": "last_line"}`, "bad.json: continue: required"},
		{"continue a word", `{"launch": {"argv": ["h", "{prompt}"]}, "continue": "always", "answer": "last_line"}`,
			`bad.json: continue: "always": want "never" or {"argv": [...]}`},
		{"continue without check", `{"launch": {"argv": ["h", "{prompt}"]}, "continue": {"argv": ["h"]}, "answer": "last_line"}`,
			"bad.json: check: required with continue"},
		{"check with never", `{"launch": {"argv": ["h", "{prompt}"]}, "continue": "never", "check": {"argv": ["c"]}, "answer": "last_line"}`,
			`bad.json: check: given, but continue is "never"`},
		{"check without argv", `{"launch": {"argv": ["h", "{prompt}"]}, "continue": {"argv": ["h"]}, "check": {}, "answer": "last_line"}`,
			"bad.json: check.argv: required"},
		{"check with env", `{"launch": {"argv": ["h", "{prompt}"]}, "continue": {"argv": ["h"]}, "check": {"argv": ["c"], "env": {}}, "answer": "last_line"}`,
			"bad.json: check.env: unknown field (known in check: argv)"},
		{"no answer", `{"launch": {"argv": ["h", "{prompt}"]}, "continue": "never"}`, "bad.json: answer: required"},
		{"answer a word", `{"launch": {"argv": ["h", "{prompt}"]}, "continue": "never", "answer": "stdout"}`, `bad.json: answer: "stdout": want "last_line"`},
		{"answer outside", `{"launch": {"argv": ["h", "{prompt}"]}, "continue": "never", "answer": {"file": "../x"}}`,
			`bad.json: answer.file: "../x": want a path inside the session folder`},
		{"answer absolute", `{"launch": {"argv": ["h", "{prompt}"]}, "continue": "never", "answer": {"file": "/x"}}`, "bad.json: answer.file:"},
		{"pause a string", `{"launch": {"argv": ["h", "{prompt}"]}, "continue": "never", "answer": "last_line", "pause": "yes"}`,
			"bad.json: pause: a JSON string, want bool"},
		{"relative root", `{"launch": {"argv": ["h", "{prompt}"]}, "continue": "never", "answer": "last_line", "session_root": "data"}`,
			`bad.json: session_root: "data": want an absolute path`},
		{"unknown relay edit", `{"launch": {"argv": ["h", "{prompt}"]}, "continue": {"argv": ["h"], "relay_edits": ["no-such-edit"]}, "check": {"argv": ["c"]}, "answer": "last_line"}`,
			`bad.json: continue.relay_edits: `},
		{"relay edits not a list", `{"launch": {"argv": ["h", "{prompt}"]}, "continue": {"argv": ["h"], "relay_edits": "x"}, "check": {"argv": ["c"]}, "answer": "last_line"}`,
			`bad.json: continue.relay_edits: a JSON string`},
		{"bad dir", `{"launch": {"argv": ["h", "{prompt}"]}, "continue": "never", "answer": "last_line", "dir": "{cwd}"}`,
			`bad.json: dir: "{cwd}": unknown placeholder {cwd}`},
	} {
		_, err := ParseSpec("bad.json", []byte(c.spec))
		if !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one with %q", c.name, err, c.want)
		}
	}
}

func TestLoadSpecNamesAMissingFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "none.json")
	if _, err := LoadSpec(file); !errors.Is(err, ErrSpec) || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), file) {
		t.Fatalf("error %v", err)
	}
}
