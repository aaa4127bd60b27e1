package driver

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Version is the Codex CLI release the driver runs.
const Version = "0.171.0"

// Provider names the model provider of the generated config.
const Provider = "stillpoint"

// Model is the model the generated config asks for: the model server
// answers from its script whatever the name (a relay may map it).
const Model = "scripted"

// Config is what every command of the driver takes.
type Config struct {
	// Codex is the codex binary; Home the session folder; Workdir the
	// project directory. All absolute.
	Codex, Home, Workdir string
	// Prompt is the task's first user message (run, check).
	Prompt string
	// Session is the saved session's thread id (continue, check; default:
	// the one run recorded in the folder).
	Session string
	// ModelURL is the Responses API server's base URL, without /v1; Headers
	// are sent with every model call.
	ModelURL string
	Headers  map[string]string
}

// Validate checks c: absolute paths, and a model URL when needModel.
func (c Config) Validate(needModel bool) error {
	var errs []error
	for _, f := range []struct{ name, v string }{{"codex", c.Codex}, {"home", c.Home}, {"work", c.Workdir}} {
		if !filepath.IsAbs(f.v) {
			errs = append(errs, fmt.Errorf("--%s %q: an absolute path is required", f.name, f.v))
		}
	}
	if needModel && c.ModelURL == "" {
		errs = append(errs, errors.New("--model-url is required"))
	}
	return errors.Join(errs...)
}

// Dirs are the directories of a session folder, relative to it:
// CODEX_HOME (the config, the rollouts and Codex's databases), HOME and
// TMPDIR.
var Dirs = struct{ Codex, Home, Tmp string }{"codex", "home", "tmp"}

// SessionFile is where run records the thread id in the session folder.
const SessionFile = "session.json"

// Environ is Codex's environment for the session folder home: everything
// of it in the folder. No switch is needed in the environment: the config
// (ConfigTOML) keeps Codex offline.
func Environ(home, path string) []string {
	j := func(d string) string { return filepath.Join(home, d) }
	return []string{
		"PATH=" + path,
		"CODEX_HOME=" + j(Dirs.Codex),
		"HOME=" + j(Dirs.Home),
		"TMPDIR=" + j(Dirs.Tmp),
		"LANG=C.UTF-8",
	}
}

// environ is Environ for c, with the driver's own PATH.
func (c Config) environ() []string {
	p := os.Getenv("PATH")
	if p == "" {
		p = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	if dir := filepath.Dir(c.Codex); !slices.Contains(filepath.SplitList(p), dir) {
		p = dir + string(filepath.ListSeparator) + p
	}
	return Environ(c.Home, p)
}

// ConfigTOML returns the config.toml of a session folder. Each switch:
//
//   - model_provider: the one provider, the model server at modelURL+"/v1"
//     on the Responses API (the only one Codex speaks), headers on every
//     call (http_headers: the task and the episode); no env_key, so no
//     Authorization header and no login.
//   - stream_idle_timeout_ms a day, request_max_retries and
//     stream_max_retries the defaults written out: a checkpoint's pause
//     must not time out a reply in flight.
//   - check_for_update_on_startup = false: no update check.
//   - analytics.enabled = false: no OTel metrics (ab.chatgpt.com).
//   - features.plugins = false, features.apps = false: no curated-plugin
//     sync (git ls-remote of github.com, api.github.com, chatgpt.com).
//   - skills.include_instructions = false, skills.bundled.enabled = false:
//     no skills message, which Codex would otherwise re-send when it
//     continues a session (and no skills unpacked in CODEX_HOME).
//   - approval_policy = "never", sandbox_mode = "danger-full-access": the
//     sandbox is Stillpoint's (what --dangerously-bypass-approvals-and-
//     sandbox says on the command line too).
//
// Codex runs with --strict-config, so a key this version does not know
// fails the launch instead of being ignored.
func ConfigTOML(modelURL string, headers map[string]string) string {
	var h []string
	for _, k := range slices.Sorted(maps.Keys(headers)) {
		h = append(h, strconv.Quote(k)+" = "+strconv.Quote(headers[k]))
	}
	return `model = ` + strconv.Quote(Model) + `
model_provider = ` + strconv.Quote(Provider) + `
check_for_update_on_startup = false
approval_policy = "never"
sandbox_mode = "danger-full-access"

[model_providers.` + Provider + `]
name = ` + strconv.Quote(Provider) + `
base_url = ` + strconv.Quote(strings.TrimSuffix(modelURL, "/")+"/v1") + `
wire_api = "responses"
http_headers = { ` + strings.Join(h, ", ") + ` }
request_max_retries = 4
stream_max_retries = 5
stream_idle_timeout_ms = 86400000

[analytics]
enabled = false

[features]
plugins = false
apps = false

[skills]
include_instructions = false

[skills.bundled]
enabled = false
`
}

// prepare makes the session folder's directories and, with a model URL,
// writes its config.toml (again at every launch: the episode header
// changes).
func (c Config) prepare() error {
	for _, d := range []string{Dirs.Codex, Dirs.Home, Dirs.Tmp} {
		if err := os.MkdirAll(filepath.Join(c.Home, d), 0o755); err != nil {
			return err
		}
	}
	if c.ModelURL == "" {
		return nil
	}
	path := filepath.Join(c.Home, Dirs.Codex, "config.toml")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(ConfigTOML(c.ModelURL, c.Headers)), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
