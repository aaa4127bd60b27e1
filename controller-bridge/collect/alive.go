package collect

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/stillpoint/stillpoint/events"
)

// The micro service names of the members a recovery waits for, and the
// metadata keys their services carry: the run, the member's name under its
// kind's key, and the instance of its membership.
var aliveServices = []struct {
	service string
	kind    events.MemberKind
}{
	{"stillpoint-agent", events.KindAgent},
	{"stillpoint-owner", events.KindOwner},
}

// pingWait is how long one ping gathers the services' answers.
const pingWait = 500 * time.Millisecond

// answering asks every agent's and owner's service for its info
// ($SRV.INFO.<service>) and returns, by member, the instances of the
// run's that answered within pingWait: the processes that run now. A
// process killed with its member's heartbeat still fresh in sp_members
// answers no more (its connection is gone), so a member that shows served
// and answers with the instance it shows has not restarted.
func (c *Collector) answering(ctx context.Context) (map[events.Member]map[string]bool, error) {
	nc := c.cfg.Conn
	inbox := nc.NewRespInbox()
	replies := make(chan *nats.Msg, 256)
	sub, err := nc.ChanSubscribe(inbox, replies)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	for _, s := range aliveServices {
		subj, err := micro.ControlSubject(micro.InfoVerb, s.service, "")
		if err != nil {
			return nil, err
		}
		if err := nc.PublishRequest(subj, inbox, nil); err != nil {
			return nil, err
		}
	}
	got := map[events.Member]map[string]bool{}
	timer := time.NewTimer(pingWait)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return got, ctx.Err()
		case <-timer.C:
			return got, nil
		case m := <-replies:
			var info micro.Info
			if json.Unmarshal(m.Data, &info) != nil || info.Metadata["run"] != c.cfg.Run || info.Metadata["instance"] == "" {
				continue
			}
			for _, s := range aliveServices {
				if info.Name != s.service {
					continue
				}
				mem, err := events.NewMember(s.kind, info.Metadata[string(s.kind)])
				if err != nil {
					continue
				}
				if got[mem] == nil {
					got[mem] = map[string]bool{}
				}
				got[mem][info.Metadata["instance"]] = true
			}
		}
	}
}
