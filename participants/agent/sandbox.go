package agent

import (
	"context"
	"time"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxclient"
)

// Sandbox is what the agent calls on a sandbox's daemon: the launches of
// its rollouts there (package sandboxapi is the contract).
// sandboxclient.Client implements it.
type Sandbox interface {
	// Launch starts a launch.
	Launch(ctx context.Context, r sandboxapi.LaunchRequest) (sandboxapi.Record, error)
	// Status returns a launch's record.
	Status(ctx context.Context, id string) (sandboxapi.Record, error)
	// Stop stops a launch (cancel: at once, without the SIGINT grace).
	Stop(ctx context.Context, id string, cancel bool) (sandboxapi.Receipt, error)
	// WaitReceipt waits at most d for a launch to end: its receipt, or a
	// service error with sandboxapi.CodeNotEnded.
	WaitReceipt(ctx context.Context, id string, d time.Duration) (sandboxapi.Receipt, error)
}

var _ Sandbox = (*sandboxclient.Client)(nil)

// sandbox returns how to call sandbox id's daemon, made once per sandbox by
// Config.SandboxService.
func (a *Agent) sandbox(id string) (Sandbox, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c, ok := a.sandboxes[id]; ok {
		return c, nil
	}
	c, err := a.cfg.SandboxService(id)
	if err != nil {
		return nil, err
	}
	a.sandboxes[id] = c
	return c, nil
}
