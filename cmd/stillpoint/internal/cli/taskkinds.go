package cli

import (
	"errors"
	"maps"
	"slices"

	"github.com/stillpoint/stillpoint/participants/owner"
	"github.com/stillpoint/stillpoint/participants/owner/commandkind"
	"github.com/stillpoint/stillpoint/participants/owner/swekind"
	"github.com/stillpoint/stillpoint/participants/scripted"
)

// taskKindConfig is what the owner command knows when it builds a task
// kind: how sandboxd goes into each sandbox, and the kinds' own flags.
type taskKindConfig struct {
	sandboxd owner.SandboxdConfig
	// harness is --harness, the host path of the harness binary.
	harness string
	// pinLimit is --pin-limit, the command kind's bound on pinned files.
	pinLimit int
}

// taskKinds are the kinds of task `stillpoint owner --task-kind` serves,
// by name.
func taskKinds() map[string]func(taskKindConfig) (owner.TaskKind, error) {
	return map[string]func(taskKindConfig) (owner.TaskKind, error){
		"scripted": func(c taskKindConfig) (owner.TaskKind, error) {
			if c.harness == "" {
				return nil, errors.New("the scripted kind needs --harness")
			}
			return scripted.Kind{Sandboxd: c.sandboxd, Harness: c.harness}, nil
		},
		"command": func(c taskKindConfig) (owner.TaskKind, error) {
			if c.pinLimit < 0 {
				return nil, errors.New("--pin-limit must not be negative")
			}
			return commandkind.Kind{Sandboxd: c.sandboxd, Harness: c.harness, MaxPin: c.pinLimit}, nil
		},
		"swe": func(c taskKindConfig) (owner.TaskKind, error) {
			return swekind.Kind{Sandboxd: c.sandboxd, Harness: c.harness}, nil
		},
	}
}

// taskKindNames returns the names of the task kinds, sorted.
func taskKindNames() []string { return slices.Sorted(maps.Keys(taskKinds())) }
