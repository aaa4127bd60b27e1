package cli

import (
	"errors"
	"maps"
	"slices"

	"github.com/stillpoint/stillpoint/participants/owner"
	"github.com/stillpoint/stillpoint/participants/scripted"
)

// taskKindConfig is what the owner command knows when it builds a task
// kind: how sandboxd goes into each sandbox, and the kinds' own flags.
type taskKindConfig struct {
	sandboxd owner.SandboxdConfig
	// harness is --harness, the host path of the scripted harness.
	harness string
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
	}
}

// taskKindNames returns the names of the task kinds, sorted.
func taskKindNames() []string { return slices.Sorted(maps.Keys(taskKinds())) }
