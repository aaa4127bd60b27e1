package cli

import (
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/stillpoint/stillpoint/participants/agent"
	"github.com/stillpoint/stillpoint/participants/claude"
	"github.com/stillpoint/stillpoint/participants/codex"
	"github.com/stillpoint/stillpoint/participants/exec"
	"github.com/stillpoint/stillpoint/participants/opencode"
	"github.com/stillpoint/stillpoint/participants/scripted"
)

// adapterConfig is what the agent command knows when it builds a harness
// adapter: the model server, the launches' bounds, and the adapters' own
// flags.
type adapterConfig struct {
	// modelURL is --model-url, the model server the harness calls.
	modelURL string
	// noPause is --no-pause: launches are stopped at a checkpoint instead.
	noPause bool
	// timeout is --launch-timeout.
	timeout time.Duration
	// harness is --harness, the scripted harness's path in the sandbox.
	harness string
	// harnessSpec is --harness-spec, the exec adapter's spec file.
	harnessSpec string
}

// adapters are the harnesses `stillpoint agent --adapter` drives, by
// name, the way taskKinds are the owner's kinds of task.
func adapters() map[string]func(adapterConfig) (agent.Adapter, error) {
	return map[string]func(adapterConfig) (agent.Adapter, error){
		"scripted": func(c adapterConfig) (agent.Adapter, error) {
			return &scripted.Adapter{Binary: c.harness, ModelURL: c.modelURL, NoPause: c.noPause, Timeout: c.timeout}, nil
		},
		"opencode": func(c adapterConfig) (agent.Adapter, error) {
			return &opencode.Adapter{ModelURL: c.modelURL, NoPause: c.noPause, Timeout: c.timeout}, nil
		},
		"codex": func(c adapterConfig) (agent.Adapter, error) {
			return &codex.Adapter{ModelURL: c.modelURL, NoPause: c.noPause, Timeout: c.timeout}, nil
		},
		"exec": func(c adapterConfig) (agent.Adapter, error) {
			if c.harnessSpec == "" {
				return nil, errors.New("--harness-spec is required: the harness's spec (docs/HARNESSES.md)")
			}
			spec, err := exec.LoadSpec(c.harnessSpec)
			if err != nil {
				return nil, err
			}
			return &exec.Adapter{Spec: spec, ModelURL: c.modelURL, NoPause: c.noPause, Timeout: c.timeout}, nil
		},
		"claude": func(c adapterConfig) (agent.Adapter, error) {
			return &claude.Adapter{ModelURL: c.modelURL, NoPause: c.noPause, Timeout: c.timeout}, nil
		},
	}
}

// adapterNames returns the names of the adapters, sorted.
func adapterNames() []string { return slices.Sorted(maps.Keys(adapters())) }
