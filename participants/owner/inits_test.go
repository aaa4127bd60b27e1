package owner

import (
	"encoding/json"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// putDaemonHeartbeat puts the heartbeat of sandbox id's daemon in
// sp_daemons, as a running daemon does, and returns its key.
func putDaemonHeartbeat(t *testing.T, env *jstest.Env, id string) string {
	t.Helper()
	m, err := events.NewMember(events.KindSandbox, id)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(events.MemberInfo{Run: testRun, Member: m, Instance: "daemon-1", Started: time.Now(), Heartbeat: time.Now()})
	key := events.MemberKey(testRun, m)
	if _, err := env.Bus.Daemons.Put(t.Context(), key, b); err != nil {
		t.Fatal(err)
	}
	return key
}

// A sandbox's init is its daemon: once it is killed (SIGKILL) the owner,
// which sees the init exit, deletes the daemon's heartbeat, so that the
// bridge and the agents take it for gone at once rather than when its
// heartbeat expires (the sandbox TTL, minutes). The heartbeat of a daemon
// whose init lives stays.
func TestDeadInitDeletesItsDaemonsHeartbeat(t *testing.T) {
	forEachProvider(t, func(t *testing.T, p fullProvider) {
		env := jstest.Start(t)
		o := newOwner(t, baseConfig(t, env, p, "o1"))
		runOwner(t, env, o)
		dies := start(t, o, "s1", ep("r1", 0))
		lives := start(t, o, "s2", ep("r2", 0))
		diesKey := putDaemonHeartbeat(t, env, dies.Sandbox.ID)
		livesKey := putDaemonHeartbeat(t, env, lives.Sandbox.ID)

		if err := syscall.Kill(dies.Sandbox.InitPID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		poll.Wait(t, 10*time.Second, "the dead daemon's heartbeat to be deleted", func() bool {
			_, err := env.Bus.Daemons.Get(t.Context(), diesKey)
			if err != nil && !errors.Is(err, natsjs.ErrKeyNotFound) {
				t.Fatal(err)
			}
			return err != nil
		})
		t.Logf("the heartbeat was deleted %v after the kill", time.Since(killed).Round(time.Millisecond))
		// The owner looks at its sandboxes every initPoll, and deletes a
		// dead daemon's heartbeat again redeleteAfter later: through
		// those looks the live daemon's heartbeat stays.
		poll.Holds(t, redeleteAfter+4*initPoll, func() error {
			if _, err := env.Bus.Daemons.Get(t.Context(), livesKey); err != nil {
				return fmt.Errorf("the heartbeat of the daemon whose init lives: %w", err)
			}
			return nil
		})
		for _, s := range []string{"s1", "s2"} {
			if err := o.EndSession(t.Context(), s); err != nil {
				t.Fatalf("end %s: %v", s, err)
			}
		}
	})
}
