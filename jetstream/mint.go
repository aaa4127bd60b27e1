package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/events"
)

// MintSubject returns the subject of run's sandbox-user minting service,
// spsvc.<run>.authority.mint: the server that holds the run's keys answers
// it (embedded.ServeMint), and only the run's owners may ask it. An owner
// so mints its sandboxes' users without holding a key that could mint any
// other name.
func MintSubject(run string) string {
	return events.ServicePrefix + "." + run + ".authority.mint"
}

// MintRequest asks for the credentials of sandbox Name, valid for TTL.
type MintRequest struct {
	Name string        `json:"name"`
	TTL  time.Duration `json:"ttl"`
}

// MintReply is the answer to a MintRequest: the .creds file's bytes and
// the user's public key, or Error.
type MintReply struct {
	Creds []byte `json:"creds,omitempty"`
	User  string `json:"user,omitempty"`
	Error string `json:"error,omitempty"`
}

// ErrMintRefused is returned (wrapped, with the server's reason) by
// Minter.Mint when the minting service refuses a request.
var ErrMintRefused = errors.New("jetstream: the authority refused to mint")

// mintWait bounds one mint request.
const mintWait = 10 * time.Second

// Minter mints sandbox users through run's minting service (MintSubject)
// on a connection with an owner's credentials; it implements
// owner.Minter.
type Minter struct {
	NC  *nats.Conn
	Run string
}

// Mint asks the service for the credentials of sandbox.<name> of run (the
// Minter's), valid for ttl; now is the service's, not the caller's.
func (m Minter) Mint(run, name string, ttl time.Duration, _ time.Time) ([]byte, string, error) {
	if run != m.Run {
		return nil, "", fmt.Errorf("%w: run %q: this minter asks for users of run %q", ErrMintRefused, run, m.Run)
	}
	b, err := json.Marshal(MintRequest{Name: name, TTL: ttl})
	if err != nil {
		return nil, "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), mintWait)
	defer cancel()
	msg, err := m.NC.RequestWithContext(ctx, MintSubject(run), b)
	if err != nil {
		return nil, "", fmt.Errorf("jetstream: mint sandbox %s of run %s: %w", name, run, err)
	}
	var r MintReply
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		return nil, "", fmt.Errorf("jetstream: mint sandbox %s of run %s: the answer: %w", name, run, err)
	}
	if r.Error != "" {
		return nil, "", fmt.Errorf("%w: sandbox %s of run %s: %s", ErrMintRefused, name, run, r.Error)
	}
	return r.Creds, r.User, nil
}
