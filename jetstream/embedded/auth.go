package embedded

import (
	"fmt"
	"slices"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// User is a client the server admits by its nkey: the client proves it holds the seed of NKey
// (jetstream.ConnConfig.NKeyFile) and gets Permissions.
type User struct {
	// Name says who the user is, in errors (e.g. the role, "agent").
	Name string
	// NKey is the user's public nkey, "U..." (nkeys.KeyPair.PublicKey of a user seed).
	NKey string
	// Permissions limits what the user may publish and subscribe to; nil allows everything.
	Permissions *Permissions
}

// Permissions are the subjects a user may publish and subscribe to. A subject may hold the
// wildcards * and >. An empty Allow list allows every subject; Deny wins over Allow.
type Permissions struct {
	Publish   Subjects
	Subscribe Subjects
}

// Subjects is an allow list and a deny list of subjects.
type Subjects struct {
	Allow []string
	Deny  []string
}

// validateUsers reports every problem of users, each wrapping ErrInvalidConfig and naming the
// field (field is "Config.Users" or "ClusterConfig.Users").
func validateUsers(field string, users []User, token string) []error {
	var errs []error
	if len(users) > 0 && token != "" {
		errs = append(errs, fmt.Errorf("%w: %s and Token: set at most one", ErrInvalidConfig, field))
	}
	seen := map[string]string{}
	for i, u := range users {
		if !nkeys.IsValidPublicUserKey(u.NKey) {
			errs = append(errs, fmt.Errorf("%w: %s[%d] (%s): NKey %q is not a public user nkey", ErrInvalidConfig, field, i, u.Name, u.NKey))
			continue
		}
		if other, ok := seen[u.NKey]; ok {
			errs = append(errs, fmt.Errorf("%w: %s[%d] (%s): NKey is also user %s's", ErrInvalidConfig, field, i, u.Name, other))
		}
		seen[u.NKey] = u.Name
	}
	return errs
}

// nkeyUsers converts users to nats-server's form.
func nkeyUsers(users []User) []*server.NkeyUser {
	if len(users) == 0 {
		return nil
	}
	out := make([]*server.NkeyUser, len(users))
	for i, u := range users {
		out[i] = &server.NkeyUser{Nkey: u.NKey, Permissions: u.Permissions.server()}
	}
	return out
}

func (p *Permissions) server() *server.Permissions {
	if p == nil {
		return nil
	}
	sp := func(s Subjects) *server.SubjectPermission {
		if len(s.Allow) == 0 && len(s.Deny) == 0 {
			return nil
		}
		return &server.SubjectPermission{Allow: slices.Clone(s.Allow), Deny: slices.Clone(s.Deny)}
	}
	return &server.Permissions{Publish: sp(p.Publish), Subscribe: sp(p.Subscribe)}
}

// validateTrust reports the problems of trust (nil is none), each wrapping ErrInvalidConfig and
// naming the field under prefix ("Config" or "ClusterConfig").
func validateTrust(prefix string, trust *Trust, users []User, token string) []error {
	if trust == nil {
		return nil
	}
	var errs []error
	if len(users) > 0 || token != "" {
		errs = append(errs, fmt.Errorf("%w: %s.Trust with Users or Token: set at most one", ErrInvalidConfig, prefix))
	}
	if _, err := jwt.DecodeOperatorClaims(trust.Operator); err != nil {
		errs = append(errs, fmt.Errorf("%w: %s.Trust.Operator: %v", ErrInvalidConfig, prefix, err))
	}
	if _, ok := trust.Accounts[trust.SystemAccount]; !ok {
		errs = append(errs, fmt.Errorf("%w: %s.Trust.SystemAccount %q: not one of Accounts", ErrInvalidConfig, prefix, trust.SystemAccount))
	}
	for pub, a := range trust.Accounts {
		if ac, err := jwt.DecodeAccountClaims(a); err != nil || ac.Subject != pub {
			errs = append(errs, fmt.Errorf("%w: %s.Trust.Accounts[%s]: not that account's JWT (%v)", ErrInvalidConfig, prefix, pub, err))
		}
	}
	return errs
}

// apply puts the server in operator mode with a memory resolver preloaded with the accounts.
func (t *Trust) apply(opts *server.Options) error {
	if t == nil {
		return nil
	}
	oc, err := jwt.DecodeOperatorClaims(t.Operator)
	if err != nil {
		return fmt.Errorf("%w: Trust.Operator: %v", ErrInvalidConfig, err)
	}
	res := &server.MemAccResolver{}
	for pub, a := range t.Accounts {
		if err := res.Store(pub, a); err != nil {
			return fmt.Errorf("%w: Trust.Accounts[%s]: %v", ErrInvalidConfig, pub, err)
		}
	}
	opts.TrustedOperators = []*jwt.OperatorClaims{oc}
	opts.AccountResolver = res
	opts.SystemAccount = t.SystemAccount
	return nil
}
