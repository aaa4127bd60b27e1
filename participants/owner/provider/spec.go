package provider

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"

	"github.com/stillpoint/stillpoint/events"
)

// ValidateID checks a sandbox or snapshot id (PROTOCOL §2 token rule:
// ^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$). field names the id in the error,
// which wraps ErrInvalid.
func ValidateID(field, id string) error {
	if err := events.ValidateToken(field, id); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// Validate checks the spec without touching the system: the id, the init
// argv, the environment, the working directory and every file path. The
// errors, joined, wrap ErrInvalid and name their field.
func (s Spec) Validate() error {
	errs := []error{ValidateID("spec.ID", s.ID)}
	if len(s.Init) > 0 && s.Init[0] == "" {
		errs = append(errs, InvalidField("spec.Init[0]", "empty program"))
	}
	for i, kv := range s.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsRune(kv, 0) {
			errs = append(errs, InvalidField(fmt.Sprintf("spec.Env[%d]", i), "%q is not KEY=value", kv))
		}
	}
	if s.Workdir != "" {
		if _, err := CleanAbs("spec.Workdir", s.Workdir); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range slices.Sorted(maps.Keys(s.Files)) {
		if _, err := CleanRel(fmt.Sprintf("spec.Files[%q]", p), p); err != nil {
			errs = append(errs, err)
		}
	}
	for i, c := range s.CopyIn {
		field := fmt.Sprintf("spec.CopyIn[%d]", i)
		if !path.IsAbs(c.HostPath) {
			errs = append(errs, InvalidField(field+".HostPath", "%q is not absolute", c.HostPath))
		}
		if _, err := CleanRel(field+".SandboxPath", c.SandboxPath); err != nil {
			errs = append(errs, err)
		}
		if c.Mode&^0o7777 != 0 {
			errs = append(errs, InvalidField(field+".Mode", "%#o has bits beyond 07777", c.Mode))
		}
	}
	for i, b := range s.Binds {
		field := fmt.Sprintf("spec.Binds[%d]", i)
		if !path.IsAbs(b.HostDir) {
			errs = append(errs, InvalidField(field+".HostDir", "%q is not absolute", b.HostDir))
		}
		if _, err := CleanRel(field+".SandboxDir", b.SandboxDir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ValidateExec checks an Exec's argv and options; the errors, joined,
// wrap ErrInvalid and name their field.
func ValidateExec(argv []string, opts ExecOptions) error {
	var errs []error
	if len(argv) == 0 || argv[0] == "" {
		errs = append(errs, InvalidField("argv", "empty command"))
	}
	if opts.Dir != "" && !path.IsAbs(opts.Dir) {
		errs = append(errs, InvalidField("opts.Dir", "%q is not absolute", opts.Dir))
	}
	for i, kv := range opts.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			errs = append(errs, InvalidField(fmt.Sprintf("opts.Env[%d]", i), "%q is not KEY=value", kv))
		}
	}
	return errors.Join(errs...)
}

// InvalidField returns an error that wraps ErrInvalid and names field,
// the way every refusal of the contract reads.
func InvalidField(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: "+format, append([]any{ErrInvalid, field}, args...)...)
}

// CleanRel checks a path relative to a sandbox's root and returns it
// cleaned: not empty, not absolute, no ".." element, no NUL, not the root.
func CleanRel(field, p string) (string, error) {
	switch {
	case p == "":
		return "", InvalidField(field, "empty path")
	case strings.ContainsRune(p, 0):
		return "", InvalidField(field, "%q contains NUL", p)
	case path.IsAbs(p):
		return "", InvalidField(field, "%q is absolute; paths are relative to the sandbox's root", p)
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return "", InvalidField(field, "%q escapes the sandbox (..)", p)
		}
	}
	c := path.Clean(p)
	if c == "." {
		return "", InvalidField(field, "%q names the sandbox's root", p)
	}
	return c, nil
}

// CleanAbs checks an absolute path inside a sandbox (no ".." element, no
// NUL) and returns it cleaned.
func CleanAbs(field, p string) (string, error) {
	if !path.IsAbs(p) {
		return "", InvalidField(field, "%q is not absolute", p)
	}
	if p == "/" {
		return "/", nil
	}
	c, err := CleanRel(field, strings.TrimLeft(p, "/"))
	if err != nil {
		return "", err
	}
	return "/" + c, nil
}

// WithDefaults returns env with KEY=value from defaults appended for each
// key env does not set.
func WithDefaults(env []string, defaults ...string) []string {
	out := slices.Clone(env)
	for _, d := range defaults {
		k, _, _ := strings.Cut(d, "=")
		if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, k+"=") }) {
			out = append(out, d)
		}
	}
	return out
}
