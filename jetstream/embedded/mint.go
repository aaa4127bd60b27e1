package embedded

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// MaxSandboxTTL is the longest validity ServeMint gives a sandbox's user.
const MaxSandboxTTL = time.Hour

// ServeMint answers run's minting service (jetstream.MintSubject) on nc,
// a connection of the run's admin, until the returned stop is called: it
// mints sandbox users with the run's scoped sandbox key, which never
// leaves the authority, for names that are ids of PROTOCOL §2 (no
// wildcard, no dot), valid up to MaxSandboxTTL. Only the run's owners may
// publish the request (MemberPermissions), so a sandbox or an agent mints
// nothing, and an owner nothing but sandboxes of its run.
func (a *Authority) ServeMint(nc *nats.Conn, run string) (stop func(), err error) {
	ra, err := a.run(run)
	if err != nil {
		return nil, err
	}
	apub, _ := ra.account.PublicKey()
	key := ra.scoped[events.KindSandbox]
	sub, err := nc.QueueSubscribe(jetstream.MintSubject(run), "mint", func(m *nats.Msg) {
		var req jetstream.MintRequest
		var rep jetstream.MintReply
		switch err := json.Unmarshal(m.Data, &req); {
		case err != nil:
			rep.Error = fmt.Sprintf("malformed request: %v", err)
		case req.TTL <= 0 || req.TTL > MaxSandboxTTL:
			rep.Error = fmt.Sprintf("ttl %s: want more than 0 and at most %s", req.TTL, MaxSandboxTTL)
		default:
			creds, user, err := mint(key, apub, events.KindSandbox, run, req.Name, req.TTL, time.Now())
			if err != nil {
				rep.Error = err.Error()
			}
			rep.Creds, rep.User = creds, user
		}
		b, _ := json.Marshal(rep)
		clear(rep.Creds)
		_ = m.Respond(b)
	})
	if err != nil {
		return nil, fmt.Errorf("embedded: serve the minting service of run %s: %w", run, err)
	}
	if err := nc.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	return func() { _ = sub.Unsubscribe() }, nil
}
