package exec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/stillpoint/stillpoint/sandboxd/relay"
)

// DefaultSessionRoot is where session folders go in a sandbox when the
// spec names no session_root: <root>/<rollout>/<n>, a fresh n each time a
// relaunch starts over.
const DefaultSessionRoot = "/var/lib/stillpoint-exec"

// DefaultPath is the PATH of a launch whose spec sets none.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Never is the value of a spec's "continue" for a harness that cannot
// continue a saved session: every relaunch starts over from the task.
const Never = "never"

// AnswerLastLine is the value of a spec's "answer" for a harness whose
// answer is the last non-empty line of its output.
const AnswerLastLine = "last_line"

// The placeholders a template may hold, each written {name}; {{ and }}
// are a literal brace.
const (
	// PlaceholderPrompt is the task's prompt, as is (newlines included).
	PlaceholderPrompt = "prompt"
	// PlaceholderTask is the task's name: the payload's "task", else the
	// rollout id. The model server routes by it (modelserver.TaskHeader).
	PlaceholderTask = "task"
	// PlaceholderRollout is the rollout id.
	PlaceholderRollout = "rollout"
	// PlaceholderAttempt is the attempt number.
	PlaceholderAttempt = "attempt"
	// PlaceholderEpisode is the episode, <rollout>-a<attempt>
	// (modelserver.EpisodeHeader).
	PlaceholderEpisode = "episode"
	// PlaceholderModelURL is the model server's base URL, without /v1:
	// the agent's --model-url, or the sandbox's model relay.
	PlaceholderModelURL = "model_url"
	// PlaceholderSession is the rollout's session folder, as the
	// harness's processes see it.
	PlaceholderSession = "session"
	// PlaceholderWorkdir is the sandbox's working directory, as the
	// harness's processes see it.
	PlaceholderWorkdir = "workdir"
	// PlaceholderSandboxRoot is the sandbox's root as its processes see
	// it, "" when it is "/": a path p inside the sandbox is
	// {sandbox_root}p (a dir sandbox's processes see host paths).
	PlaceholderSandboxRoot = "sandbox_root"
)

// Placeholders lists every placeholder name, in the order the docs give
// them.
var Placeholders = []string{PlaceholderPrompt, PlaceholderTask, PlaceholderRollout, PlaceholderAttempt, PlaceholderEpisode,
	PlaceholderModelURL, PlaceholderSession, PlaceholderWorkdir, PlaceholderSandboxRoot}

// ErrSpec is wrapped by every error of a harness spec that does not
// parse or check; the message names the file and the field.
var ErrSpec = errors.New("exec: bad harness spec")

// Spec is a harness defined in JSON (docs/HARNESSES.md): how to launch it,
// continue it, decide whether it can continue, and read its answer.
type Spec struct {
	// Launch starts the task in a new session folder.
	Launch Command
	// Continue continues a saved session with no new user turn; nil
	// (the spec's "never") when the harness cannot: every relaunch then
	// starts over in a fresh folder.
	Continue *Command
	// Check decides, before a relaunch, whether the saved session can be
	// continued: exit status 0 continues, 1 starts over in a fresh
	// folder, anything else is an error. Only with Continue. It runs with
	// the sandbox daemon's environment, not Launch's.
	Check []Template
	// AnswerFile is where the answer is, relative to the session folder;
	// "" when the answer is the last non-empty line of the output.
	AnswerFile string
	// Pause tells whether launches are paused at checkpoints (default
	// true); false stops them at a checkpoint and relaunches after it.
	Pause bool
	// SessionRoot is where session folders go in the sandbox (default
	// DefaultSessionRoot).
	SessionRoot string
	// Dir is the launch's working directory (default {workdir}).
	Dir Template
}

// Command is a launch of the harness: argv and environment, each a
// template. Env is the whole environment (PATH defaults to DefaultPath),
// sorted by name. RelayEdits names the sandbox's model relay's edits
// (sandboxd/relay) applied to the launch's model calls: what a harness
// adds to a request when it continues a session, removed before the
// model sees it.
type Command struct {
	Argv       []Template
	Env        []EnvVar
	RelayEdits []string
}

// has tells whether c's argv or env holds placeholder name.
func (c Command) has(name string) bool {
	return slices.ContainsFunc(c.Argv, func(t Template) bool { return t.has(name) }) ||
		slices.ContainsFunc(c.Env, func(v EnvVar) bool { return v.Value.has(name) })
}

// EnvVar is one variable of a launch's environment.
type EnvVar struct {
	Name  string
	Value Template
}

// Template is an argv element or an environment value with placeholders;
// Expand fills them. Each element stays one argv element whatever it
// expands to: nothing goes through a shell.
type Template struct {
	raw   string
	parts []part
}

// part is a literal (name "") or a placeholder.
type part struct{ text, name string }

// String returns the template as written.
func (t Template) String() string { return t.raw }

// Expand returns t with every placeholder replaced by its value in vals.
func (t Template) Expand(vals map[string]string) string {
	var b strings.Builder
	for _, p := range t.parts {
		if p.name == "" {
			b.WriteString(p.text)
		} else {
			b.WriteString(vals[p.name])
		}
	}
	return b.String()
}

// has tells whether t holds placeholder name.
func (t Template) has(name string) bool {
	return slices.ContainsFunc(t.parts, func(p part) bool { return p.name == name })
}

// ParseTemplate parses s: literal text, {name} placeholders of
// Placeholders, and {{ and }} for literal braces.
func ParseTemplate(s string) (Template, error) {
	t := Template{raw: s}
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			t.parts = append(t.parts, part{text: lit.String()})
			lit.Reset()
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '{' && i+1 < len(s) && s[i+1] == '{', c == '}' && i+1 < len(s) && s[i+1] == '}':
			lit.WriteByte(c)
			i++
		case c == '{':
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				return t, fmt.Errorf("a { with no }: write {{ for a literal brace")
			}
			name := s[i+1 : i+end]
			if !slices.Contains(Placeholders, name) {
				return t, fmt.Errorf("unknown placeholder {%s} (known: {%s})", name, strings.Join(Placeholders, "}, {"))
			}
			flush()
			t.parts = append(t.parts, part{name: name})
			i += end
		case c == '}':
			return t, fmt.Errorf("a } with no {: write }} for a literal brace")
		default:
			lit.WriteByte(c)
		}
	}
	flush()
	return t, nil
}

// LoadSpec reads and parses the harness spec in file.
func LoadSpec(file string) (*Spec, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSpec, err)
	}
	return ParseSpec(file, b)
}

// ParseSpec parses a harness spec, strictly: an unknown field, a value of
// the wrong type, an unknown placeholder, a missing launch or answer are
// refused, each error naming file and the field (launch.argv[2],
// continue.env.HOME, ...).
func ParseSpec(file string, b []byte) (*Spec, error) {
	d := decoder{file: file}
	s := &Spec{Pause: true, SessionRoot: DefaultSessionRoot}
	top, err := d.object("", b, "launch", "continue", "check", "answer", "pause", "session_root", "dir")
	if err != nil {
		return nil, err
	}
	raw, ok := top["launch"]
	if !ok {
		return nil, d.errorf("launch", "required: the harness's first launch, {\"argv\": [...], \"env\": {...}}")
	}
	if s.Launch, err = d.command("launch", raw); err != nil {
		return nil, err
	}
	if !s.Launch.has(PlaceholderPrompt) {
		return nil, d.errorf("launch", "no {%s} in its argv or env: the harness would never get the task", PlaceholderPrompt)
	}
	continues := false
	if raw, ok := top["continue"]; ok {
		var never string
		if json.Unmarshal(raw, &never) == nil {
			if never != Never {
				return nil, d.errorf("continue", "%q: want %q or {\"argv\": [...]}", never, Never)
			}
		} else {
			c, err := d.command("continue", raw)
			if err != nil {
				return nil, err
			}
			// Its environment is launch's with its own over it.
			c.Env = mergeEnv(s.Launch.Env, c.Env)
			s.Continue, continues = &c, true
		}
	} else {
		return nil, d.errorf("continue", "required: {\"argv\": [...]} to continue a saved session, or %q to relaunch from the task", Never)
	}
	switch raw, ok := top["check"]; {
	case ok && !continues:
		return nil, d.errorf("check", "given, but continue is %q: there is nothing to decide", Never)
	case !ok && continues:
		return nil, d.errorf("check", "required with continue: {\"argv\": [...]}, exit 0 to continue, 1 to start over")
	case ok:
		obj, err := d.object("check", raw, "argv")
		if err != nil {
			return nil, err
		}
		if s.Check, err = d.argv("check.argv", obj["argv"]); err != nil {
			return nil, err
		}
	}
	raw, ok = top["answer"]
	if !ok {
		return nil, d.errorf("answer", "required: %q or {\"file\": \"<path in the session folder>\"}", AnswerLastLine)
	}
	if err := d.answer(s, raw); err != nil {
		return nil, err
	}
	if raw, ok := top["pause"]; ok {
		if err := d.strict("pause", raw, &s.Pause); err != nil {
			return nil, err
		}
	}
	if raw, ok := top["session_root"]; ok {
		if err := d.strict("session_root", raw, &s.SessionRoot); err != nil {
			return nil, err
		}
		if !path.IsAbs(s.SessionRoot) || path.Clean(s.SessionRoot) == "/" {
			return nil, d.errorf("session_root", "%q: want an absolute path in the sandbox, not /", s.SessionRoot)
		}
		s.SessionRoot = path.Clean(s.SessionRoot)
	}
	dir := "{" + PlaceholderWorkdir + "}"
	if raw, ok := top["dir"]; ok {
		if err := d.strict("dir", raw, &dir); err != nil {
			return nil, err
		}
	}
	if s.Dir, err = d.template("dir", dir); err != nil {
		return nil, err
	}
	return s, nil
}

// decoder decodes a spec's JSON strictly, its errors naming the file and
// the field.
type decoder struct{ file string }

func (d decoder) errorf(field, format string, args ...any) error {
	return fmt.Errorf("%w %s: %s: %s", ErrSpec, d.file, field, fmt.Sprintf(format, args...))
}

// strict decodes raw into v, refusing null and trailing data.
func (d decoder) strict(field string, raw json.RawMessage, v any) error {
	if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return d.errorf(field, "null: give a value or leave the field out")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return d.errorf(field, "a JSON %s, want %s", te.Value, te.Type)
		}
		return d.errorf(field, "%v", err)
	}
	if dec.More() {
		return d.errorf(field, "data after the value")
	}
	return nil
}

// object decodes raw as a JSON object with only the known keys.
func (d decoder) object(field string, raw []byte, known ...string) (map[string]json.RawMessage, error) {
	name := field
	if name == "" {
		name = "the spec"
	}
	var obj map[string]json.RawMessage
	if err := d.strict(name, raw, &obj); err != nil {
		return nil, err
	}
	for k := range obj {
		if !slices.Contains(known, k) {
			full := k
			if field != "" {
				full = field + "." + k
			}
			return nil, d.errorf(full, "unknown field (known in %s: %s)", name, strings.Join(known, ", "))
		}
	}
	return obj, nil
}

func (d decoder) template(field, s string) (Template, error) {
	t, err := ParseTemplate(s)
	if err != nil {
		return t, d.errorf(field, "%q: %v", s, err)
	}
	if strings.ContainsRune(s, 0) {
		return t, d.errorf(field, "a NUL byte, which no argv or environment can carry")
	}
	return t, nil
}

func (d decoder) argv(field string, raw json.RawMessage) ([]Template, error) {
	if raw == nil {
		return nil, d.errorf(field, "required: the command, one JSON string per argument")
	}
	var ss []string
	if err := d.strict(field, raw, &ss); err != nil {
		return nil, err
	}
	if len(ss) == 0 || ss[0] == "" {
		return nil, d.errorf(field, "empty: give the program and its arguments")
	}
	out := make([]Template, len(ss))
	for i, s := range ss {
		t, err := d.template(fmt.Sprintf("%s[%d]", field, i), s)
		if err != nil {
			return nil, err
		}
		out[i] = t
	}
	return out, nil
}

func (d decoder) command(field string, raw json.RawMessage) (Command, error) {
	obj, err := d.object(field, raw, "argv", "env", "relay_edits")
	if err != nil {
		return Command{}, err
	}
	var c Command
	if c.Argv, err = d.argv(field+".argv", obj["argv"]); err != nil {
		return c, err
	}
	if raw, ok := obj["relay_edits"]; ok {
		if err := d.strict(field+".relay_edits", raw, &c.RelayEdits); err != nil {
			return c, err
		}
		if _, err := relay.LookupEdits(c.RelayEdits); err != nil {
			return c, d.errorf(field+".relay_edits", "%v", err)
		}
	}
	if raw, ok := obj["env"]; ok {
		var env map[string]string
		if err := d.strict(field+".env", raw, &env); err != nil {
			return c, err
		}
		for name, v := range env {
			if name == "" || strings.ContainsAny(name, "=\x00") {
				return c, d.errorf(field+".env", "%q is no variable name", name)
			}
			t, err := d.template(field+".env."+name, v)
			if err != nil {
				return c, err
			}
			c.Env = append(c.Env, EnvVar{Name: name, Value: t})
		}
		slices.SortFunc(c.Env, func(a, b EnvVar) int { return strings.Compare(a.Name, b.Name) })
	}
	return c, nil
}

func (d decoder) answer(s *Spec, raw json.RawMessage) error {
	var form string
	if json.Unmarshal(raw, &form) == nil {
		if form != AnswerLastLine {
			return d.errorf("answer", "%q: want %q or {\"file\": \"<path in the session folder>\"}", form, AnswerLastLine)
		}
		return nil
	}
	obj, err := d.object("answer", raw, "file")
	if err != nil {
		return err
	}
	if obj["file"] == nil {
		return d.errorf("answer.file", "required: the answer's file, relative to the session folder")
	}
	if err := d.strict("answer.file", obj["file"], &s.AnswerFile); err != nil {
		return err
	}
	f := s.AnswerFile
	if f == "" || path.IsAbs(f) || strings.ContainsRune(f, 0) || slices.Contains(strings.Split(f, "/"), "..") || path.Clean(f) == "." {
		return d.errorf("answer.file", "%q: want a path inside the session folder, relative to it", f)
	}
	s.AnswerFile = path.Clean(f)
	return nil
}

// mergeEnv returns base with over's variables over it, sorted by name.
func mergeEnv(base, over []EnvVar) []EnvVar {
	out := slices.Clone(over)
	for _, v := range base {
		if !slices.ContainsFunc(over, func(o EnvVar) bool { return o.Name == v.Name }) {
			out = append(out, v)
		}
	}
	slices.SortFunc(out, func(a, b EnvVar) int { return strings.Compare(a.Name, b.Name) })
	return out
}
