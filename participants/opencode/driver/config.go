package driver

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/stillpoint/stillpoint/internal/atomicfile"
)

// Version is the OpenCode release the driver is made for: its config, its
// events, its store, its server's routes and the plugin stub's version
// are 1.18.33's.
const Version = "1.18.33"

// Provider and Model name the model in the generated config: OpenCode
// calls it "stillpoint/<Model>"; the model server sees <Model>.
const (
	Provider = "stillpoint"
	Model    = "scripted"
)

// Config is what every driver command is given.
type Config struct {
	// OpenCode is the opencode binary (as the sandbox's processes see it).
	OpenCode string
	// Home is the session folder: OpenCode's data, config, cache, state,
	// scratch and home directories are under it (Dirs), so that its store
	// is the session and nothing of it is elsewhere.
	Home string
	// Workdir is the project directory: the working directory and PWD of
	// every OpenCode process.
	Workdir string
	// Title is the session's title (run), and how check and continue find
	// the session when they are not told its id.
	Title string
	// Prompt is the first user message: run sends it; check requires the
	// saved session to start with it.
	Prompt string
	// Session is the saved session's id (check, continue); empty to find
	// it in Home.
	Session string
	// ModelURL is the chat-completions server's base URL (OpenCode calls
	// <ModelURL>/v1/chat/completions); Headers go with every model call.
	ModelURL string
	Headers  map[string]string
	// ToolTimeout is the bash tool's default timeout (0: an hour), not
	// OpenCode's 2 minutes: OpenCode's timers run on in a pause, so a
	// timeout shorter than a pause kills a paused tool the moment it
	// continues (a timeout the model gives in its call, likewise); the
	// launch's own deadline, which paused time does not count, is the
	// bound of a tool that hangs.
	ToolTimeout time.Duration
}

// Validate checks the config of a command; the errors, joined, name the
// field.
func (c Config) Validate(needModel bool) error {
	var errs []error
	for _, f := range []struct{ name, v string }{{"opencode", c.OpenCode}, {"home", c.Home}, {"work", c.Workdir}} {
		if !filepath.IsAbs(f.v) {
			errs = append(errs, fmt.Errorf("--%s %q: an absolute path is required", f.name, f.v))
		}
	}
	if needModel && c.ModelURL == "" {
		errs = append(errs, errors.New("--model-url is required"))
	}
	return errors.Join(errs...)
}

// Dirs are the directories of a session folder, relative to it: one per
// XDG base directory, the scratch directory (TMPDIR) and HOME.
var Dirs = struct{ Data, Config, Cache, State, Tmp, Home string }{"data", "config", "cache", "state", "tmp", "home"}

// StoreFiles are OpenCode's session store, relative to the session
// folder: the database and its write-ahead log and shared-memory files,
// which hold the data together (OpenCode exits without a checkpoint of
// the log).
var StoreFiles = []string{"data/opencode/opencode.db", "data/opencode/opencode.db-wal", "data/opencode/opencode.db-shm"}

// SessionFile is where run records the session's id in the session folder.
const SessionFile = "session.json"

// PromptFile is where run writes the prompt, in the session folder.
const PromptFile = "prompt.txt"

// Environ returns the environment of OpenCode in the session folder home
// with the project directory workdir: the XDG directories, TMPDIR, HOME
// and PWD in the folder; path as PATH; and the switches that keep it
// offline and quiet (no autoupdate, no models.dev fetch, no sharing, no
// LSP download, no per-run native library in TMPDIR).
func Environ(home, workdir, path string, toolTimeout time.Duration) []string {
	if toolTimeout <= 0 {
		toolTimeout = time.Hour
	}
	j := func(d string) string { return filepath.Join(home, d) }
	return []string{
		"PATH=" + path,
		"HOME=" + j(Dirs.Home),
		"XDG_DATA_HOME=" + j(Dirs.Data),
		"XDG_CONFIG_HOME=" + j(Dirs.Config),
		"XDG_CACHE_HOME=" + j(Dirs.Cache),
		"XDG_STATE_HOME=" + j(Dirs.State),
		"TMPDIR=" + j(Dirs.Tmp),
		"PWD=" + workdir,
		"LANG=C.UTF-8",
		"OPENCODE_DISABLE_AUTOUPDATE=1",
		"OPENCODE_DISABLE_MODELS_FETCH=1",
		"OPENCODE_DISABLE_SHARE=1",
		"OPENCODE_DISABLE_LSP_DOWNLOAD=1",
		"OPENCODE_DISABLE_FFF=1",
		fmt.Sprintf("OPENCODE_EXPERIMENTAL_BASH_DEFAULT_TIMEOUT_MS=%d", toolTimeout.Milliseconds()),
	}
}

// environ is Environ for c, with the driver's own PATH after the
// directory of the opencode binary (where ripgrep is too, SandboxBinDir).
func (c Config) environ() []string {
	p, dir := os.Getenv("PATH"), filepath.Dir(c.OpenCode)
	if !slices.Contains(filepath.SplitList(p), dir) {
		p = dir + string(filepath.ListSeparator) + p
	}
	return Environ(c.Home, c.Workdir, p, c.ToolTimeout)
}

// ConfigJSON returns the opencode.json of a session folder: its one
// provider is the model server at modelURL (OpenAI-compatible, headers on
// every call, no timeouts: a pause must not fail a call in flight), the
// same model for the title, no autoupdate, no sharing, and a tool may
// reach outside the project directory (in `opencode run` OpenCode would
// otherwise ask, reject its own question, and end the task with exit code
// 0).
func ConfigJSON(modelURL string, headers map[string]string) []byte {
	if headers == nil {
		headers = map[string]string{}
	}
	c := map[string]any{
		"$schema":     "https://opencode.ai/config.json",
		"autoupdate":  false,
		"share":       "disabled",
		"model":       Provider + "/" + Model,
		"small_model": Provider + "/" + Model,
		"permission":  map[string]string{"external_directory": "allow"},
		"provider": map[string]any{Provider: map[string]any{
			"npm":  "@ai-sdk/openai-compatible",
			"name": "Stillpoint model server",
			"options": map[string]any{
				"baseURL": strings.TrimRight(modelURL, "/") + "/v1", "apiKey": "unused",
				"headers": headers, "timeout": false, "headerTimeout": false, "chunkTimeout": false,
			},
			"models": map[string]any{Model: map[string]any{
				"name": "Scripted", "tool_call": true, "limit": map[string]int{"context": 200000, "output": 8192},
			}},
		}},
	}
	b, _ := json.MarshalIndent(c, "", "  ")
	return append(b, '\n')
}

// pluginStub is what keeps OpenCode from starting its background npm
// install of @opencode-ai/plugin into the config directory at every
// start: the install is skipped when node_modules exists and every
// dependency of package.json is in package-lock.json.
var pluginStub = map[string]string{
	"package.json":      `{"dependencies":{"@opencode-ai/plugin":"` + Version + `"}}` + "\n",
	"package-lock.json": `{"lockfileVersion":3,"packages":{"":{"dependencies":{"@opencode-ai/plugin":"` + Version + `"}}}}` + "\n",
}

// prepare makes the session folder's directories and writes the config
// (when the model is known) and the plugin stub.
func (c Config) prepare() error {
	conf := filepath.Join(c.Home, Dirs.Config, "opencode")
	for _, d := range []string{Dirs.Data, Dirs.Cache, Dirs.State, Dirs.Tmp, Dirs.Home} {
		if err := os.MkdirAll(filepath.Join(c.Home, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(conf, "node_modules"), 0o755); err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(pluginStub)) {
		if err := atomicfile.Write(filepath.Join(conf, name), []byte(pluginStub[name]), 0o644); err != nil {
			return err
		}
	}
	if c.ModelURL != "" {
		if err := atomicfile.Write(filepath.Join(conf, "opencode.json"), ConfigJSON(c.ModelURL, c.Headers), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// savedSession is SessionFile's content.
type savedSession struct {
	ID    string `json:"id"`
	Title string `json:"title,omitempty"`
}

// sessionFile is SessionFile of the session folder.
func (c Config) sessionFile() atomicfile.JSON[savedSession] {
	return atomicfile.JSON[savedSession]{Path: filepath.Join(c.Home, SessionFile)}
}

// savedSessionID returns the id run recorded, or "".
func (c Config) savedSessionID() string {
	s, _ := c.sessionFile().Read()
	return s.ID
}
