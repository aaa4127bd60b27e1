package embedded

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/atomicfile"
)

// AccountName is the name of the one account every Stillpoint client is a user of.
const AccountName = "STILLPOINT"

// DefaultSandboxTTL is how long a sandbox's user JWT is valid when Signer.Mint is given no
// expiry: its owner renews it well before (SandboxCreds).
const DefaultSandboxTTL = 10 * time.Minute

var (
	// ErrNotMember is returned (wrapped) by Authority.MemberCreds and Signer.Mint for a run or
	// member name that a member's permissions cannot carry: not an id of PROTOCOL §2, an upper-case
	// run (JWT tags are lower case), an underscore in an agent's or owner's run or name (its
	// consumer's name would not be member.ConsumerName's), or a kind the signer does not sign.
	ErrNotMember = errors.New("embedded: not a member these credentials can name")
)

// Authority is the decentralized auth of one bus (NATS operator mode): an operator, a system
// account, and account STILLPOINT, which every client is a user of. Users are minted as JWTs: the
// bridge, controller and admin roles with RolePermissions by the account's signing key
// (RoleCreds), and every agent, owner and sandbox by the scoped signing key of its kind, whose
// template (MemberPermissions) names the member by the user's name and run tag, so that whoever
// holds that key can mint users of that kind and nothing more (MemberCreds, Signer). Every key's
// seed is a file in the authority's directory; LoadAuthority makes the missing ones.
type Authority struct {
	dir      string
	operator nkeys.KeyPair
	system   nkeys.KeyPair
	account  nkeys.KeyPair
	signer   nkeys.KeyPair
	scoped   map[events.MemberKind]nkeys.KeyPair

	mu      sync.Mutex
	revoked map[string]time.Time // user public key → revoked up to then
}

// memberKinds are the kinds with a scoped signing key.
var memberKinds = []events.MemberKind{events.KindAgent, events.KindOwner, events.KindSandbox}

// LoadAuthority reads the authority's keys from dir (operator.nk, system.nk, account.nk,
// signer.nk, and <kind>-signer.nk for agent, owner and sandbox), creating the missing ones (dir
// 0700, files 0600), and the revocations of the account JWT that Revoke keeps there
// (AccountJWTFile), if any.
func LoadAuthority(dir string) (*Authority, error) {
	if dir == "" {
		return nil, fmt.Errorf("%w: LoadAuthority: dir required", ErrInvalidConfig)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded: auth dir: %w", err)
	}
	a := &Authority{dir: dir, scoped: map[events.MemberKind]nkeys.KeyPair{}, revoked: map[string]time.Time{}}
	var err error
	if a.operator, err = loadOrCreateKey(filepath.Join(dir, "operator.nk"), nkeys.PrefixByteOperator); err != nil {
		return nil, err
	}
	if a.system, err = loadOrCreateKey(filepath.Join(dir, "system.nk"), nkeys.PrefixByteAccount); err != nil {
		return nil, err
	}
	if a.account, err = loadOrCreateKey(filepath.Join(dir, "account.nk"), nkeys.PrefixByteAccount); err != nil {
		return nil, err
	}
	if a.signer, err = loadOrCreateKey(filepath.Join(dir, "signer.nk"), nkeys.PrefixByteAccount); err != nil {
		return nil, err
	}
	for _, k := range memberKinds {
		if a.scoped[k], err = loadOrCreateKey(SignerFile(dir, k), nkeys.PrefixByteAccount); err != nil {
			return nil, err
		}
	}
	if err := a.loadRevocations(); err != nil {
		return nil, err
	}
	return a, nil
}

// AccountJWTFile returns the path of the account JWT an authority keeps in its dir,
// dir/account.jwt: Revoke writes it, re-signed with every revocation, and LoadAuthority reads the
// revocations back from it, so that a server restarted on the same dir still refuses them.
func AccountJWTFile(dir string) string {
	return filepath.Join(dir, "account.jwt")
}

// loadRevocations adds the revocations of the account JWT in AccountJWTFile to the authority's
// (the later time of the two for a user in both). No file is none. A file that is not this
// account's JWT signed by this operator is an error: a revocation must not be lost silently.
func (a *Authority) loadRevocations() error {
	path := AccountJWTFile(a.dir)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("embedded: account JWT: %w", err)
	}
	ac, err := jwt.DecodeAccountClaims(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("embedded: account JWT %s: %w", path, err)
	}
	apub, _ := a.account.PublicKey()
	opub, _ := a.operator.PublicKey()
	if ac.Subject != apub || ac.Issuer != opub {
		return fmt.Errorf("embedded: account JWT %s: account %s signed by %s, want account %s signed by operator %s",
			path, ac.Subject, ac.Issuer, apub, opub)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for user, at := range ac.Revocations {
		if t := time.Unix(at, 0); t.After(a.revoked[user]) {
			a.revoked[user] = t
		}
	}
	return nil
}

// SignerFile returns the path of kind's scoped signing key seed in an authority's dir:
// dir/<kind>-signer.nk. WriteSigner writes the file an owner mints its sandboxes' users with.
func SignerFile(dir string, kind events.MemberKind) string {
	return filepath.Join(dir, string(kind)+"-signer.nk")
}

// CredsFile returns the path of role's credentials in an authority's dir: dir/<role>.creds, as
// WriteRoleCreds writes them.
func CredsFile(dir string, role Role) string {
	return filepath.Join(dir, string(role)+".creds")
}

// Trust is what a server in operator mode needs: the operator's JWT and the accounts' JWTs,
// preloaded into a memory resolver.
type Trust struct {
	// Operator is the operator JWT.
	Operator string
	// SystemAccount is the system account's public key.
	SystemAccount string
	// Accounts maps each account's public key to its JWT.
	Accounts map[string]string
}

// Trust returns the JWTs a server trusts the authority's users with (Config.Trust).
func (a *Authority) Trust() (*Trust, error) {
	opub, _ := a.operator.PublicKey()
	spub, _ := a.system.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "stillpoint"
	oc.SystemAccount = spub
	ojwt, err := oc.Encode(a.operator)
	if err != nil {
		return nil, fmt.Errorf("embedded: operator JWT: %w", err)
	}
	sc := jwt.NewAccountClaims(spub)
	sc.Name = "SYS"
	sjwt, err := sc.Encode(a.operator)
	if err != nil {
		return nil, fmt.Errorf("embedded: system account JWT: %w", err)
	}
	ajwt, err := a.AccountJWT()
	if err != nil {
		return nil, err
	}
	apub, _ := a.account.PublicKey()
	return &Trust{Operator: ojwt, SystemAccount: spub, Accounts: map[string]string{spub: sjwt, apub: ajwt}}, nil
}

// AccountJWT returns the JWT of account STILLPOINT: JetStream without limits, the signing key
// of the roles, one scoped signing key per member kind with MemberPermissions as its template,
// and the users revoked so far (Revoke).
func (a *Authority) AccountJWT() (string, error) {
	apub, _ := a.account.PublicKey()
	ac := jwt.NewAccountClaims(apub)
	ac.Name = AccountName
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1,
		MaxAckPending: -1, MemoryMaxStreamBytes: -1, DiskMaxStreamBytes: -1}
	spub, _ := a.signer.PublicKey()
	ac.SigningKeys.Add(spub)
	for _, k := range memberKinds {
		kpub, _ := a.scoped[k].PublicKey()
		scope := jwt.NewUserScope()
		scope.Key = kpub
		scope.Role = string(k)
		scope.Description = "users of member kind " + string(k) + ", each named after its member"
		p := MemberPermissions(k, runTemplate, nameTemplate)
		scope.Template.Pub = jwt.Permission{Allow: p.Publish.Allow, Deny: p.Publish.Deny}
		scope.Template.Sub = jwt.Permission{Allow: p.Subscribe.Allow, Deny: p.Subscribe.Deny}
		ac.SigningKeys.AddScopedSigner(scope)
	}
	a.mu.Lock()
	for user, at := range a.revoked {
		ac.RevokeAt(user, at)
	}
	a.mu.Unlock()
	s, err := ac.Encode(a.operator)
	if err != nil {
		return "", fmt.Errorf("embedded: account JWT: %w", err)
	}
	return s, nil
}

// Revoke revokes every JWT of user (a public user key) issued up to now. AccountJWT carries it from
// then on, and Server.UpdateAccount gives it to a running server, which disconnects the user. It is
// kept in the authority's dir too: Revoke writes AccountJWTFile, re-signed with every revocation
// (its own, and those another process on the dir wrote meanwhile), before it returns, and
// LoadAuthority reads them back, so a server restarted on the dir refuses the user still.
func (a *Authority) Revoke(user string) error {
	if !nkeys.IsValidPublicUserKey(user) {
		return fmt.Errorf("%w: Revoke: %q is not a user's public key", ErrInvalidConfig, user)
	}
	if err := a.loadRevocations(); err != nil {
		return err
	}
	a.mu.Lock()
	a.revoked[user] = time.Now()
	a.mu.Unlock()
	ajwt, err := a.AccountJWT()
	if err != nil {
		return err
	}
	if err := atomicfile.Write(AccountJWTFile(a.dir), []byte(ajwt+"\n"), 0o600); err != nil {
		return fmt.Errorf("embedded: account JWT: %w", err)
	}
	return nil
}

// RoleCreds mints the credentials (a .creds file's bytes) of role, one of bridge, controller and
// admin, with RolePermissions(role, run) and no expiry: one user for every process of the role, its
// seed in dir/<role>.nk (made if missing). A member role has no such user: each member gets its own
// (MemberCreds).
func (a *Authority) RoleCreds(role Role, run string) ([]byte, error) {
	switch role {
	case RoleBridge, RoleController, RoleAdmin:
	default:
		return nil, fmt.Errorf("%w: RoleCreds: role %q: want bridge, controller or admin (members get their own, MemberCreds)", ErrInvalidConfig, role)
	}
	perms, err := RolePermissions(role, run)
	if err != nil {
		return nil, err
	}
	ukp, err := loadOrCreateKey(SeedFile(a.dir, role), nkeys.PrefixByteUser)
	if err != nil {
		return nil, err
	}
	defer ukp.Wipe()
	upub, _ := ukp.PublicKey()
	apub, _ := a.account.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.Name = string(role)
	uc.IssuerAccount = apub
	if perms != nil {
		uc.Pub = jwt.Permission{Allow: perms.Publish.Allow, Deny: perms.Publish.Deny}
		uc.Sub = jwt.Permission{Allow: perms.Subscribe.Allow, Deny: perms.Subscribe.Deny}
	}
	token, err := uc.Encode(a.signer)
	if err != nil {
		return nil, fmt.Errorf("embedded: %s JWT: %w", role, err)
	}
	seed, _ := ukp.Seed()
	defer clear(seed)
	return jwt.FormatUserConfig(token, seed)
}

// WriteRoleCreds writes RoleCreds of bridge, controller and admin to CredsFile(dir, role), mode
// 0600, and returns their paths by role.
func (a *Authority) WriteRoleCreds(run string) (map[Role]string, error) {
	out := map[Role]string{}
	for _, role := range []Role{RoleBridge, RoleController, RoleAdmin} {
		b, err := a.RoleCreds(role, run)
		if err != nil {
			return nil, err
		}
		path := CredsFile(a.dir, role)
		err = atomicfile.Write(path, b, 0o600)
		clear(b)
		if err != nil {
			return nil, fmt.Errorf("embedded: %s creds: %w", role, err)
		}
		out[role] = path
	}
	return out, nil
}

// MemberCreds mints the credentials of member m of run with the scoped signing key of m's kind,
// valid for ttl (0: no expiry), with a new user key. It returns the .creds bytes and the user's
// public key (for Revoke).
func (a *Authority) MemberCreds(run string, m events.Member, ttl time.Duration) ([]byte, string, error) {
	if err := m.Validate(); err != nil {
		return nil, "", fmt.Errorf("%w: %w", ErrNotMember, err)
	}
	kp, ok := a.scoped[m.Kind()]
	if !ok {
		return nil, "", fmt.Errorf("%w: %s: kind %s has no users of its own", ErrNotMember, m, m.Kind())
	}
	apub, _ := a.account.PublicKey()
	return mint(kp, apub, m.Kind(), run, m.Name(), ttl, time.Now())
}

// Signer is the scoped signing key of one member kind, as its file holds it (WriteSigner): the key
// and the account it signs for. An owner holds the sandbox kind's to mint each of its sandboxes a
// user of its own (Mint); the account's template limits what those users may do, whatever the
// holder asks.
type Signer struct {
	kind    events.MemberKind
	account string
	key     nkeys.KeyPair
}

// signerFile is the JSON of a signer file.
type signerFile struct {
	Kind    events.MemberKind `json:"kind"`
	Account string            `json:"account"`
	Seed    string            `json:"seed"`
}

// WriteSigner writes the signer file of kind's scoped signing key to path (mode 0600), for
// LoadSigner.
func (a *Authority) WriteSigner(kind events.MemberKind, path string) error {
	kp, ok := a.scoped[kind]
	if !ok {
		return fmt.Errorf("%w: WriteSigner: kind %q has no scoped signing key", ErrInvalidConfig, kind)
	}
	seed, _ := kp.Seed() // the key's own bytes: not to be cleared here
	apub, _ := a.account.PublicKey()
	b, err := json.Marshal(signerFile{Kind: kind, Account: apub, Seed: string(seed)})
	if err != nil {
		return fmt.Errorf("embedded: signer file: %w", err)
	}
	defer clear(b)
	if err := atomicfile.Write(path, b, 0o600); err != nil {
		return fmt.Errorf("embedded: signer file: %w", err)
	}
	return nil
}

// LoadSigner reads a signer file (WriteSigner).
func LoadSigner(path string) (*Signer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("embedded: signer file: %w", err)
	}
	defer clear(b)
	var f signerFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("embedded: signer file %s: %w", path, err)
	}
	if !nkeys.IsValidPublicAccountKey(f.Account) {
		return nil, fmt.Errorf("embedded: signer file %s: account %q is not an account's public key", path, f.Account)
	}
	kp, err := nkeys.FromSeed([]byte(f.Seed))
	if err != nil {
		return nil, fmt.Errorf("embedded: signer file %s: %w", path, err)
	}
	if pub, _ := kp.PublicKey(); !nkeys.IsValidPublicAccountKey(pub) {
		return nil, fmt.Errorf("embedded: signer file %s: not an account signing key", path)
	}
	return &Signer{kind: f.Kind, account: f.Account, key: kp}, nil
}

// Kind returns the member kind the signer mints users of.
func (s *Signer) Kind() events.MemberKind { return s.kind }

// Mint returns the credentials of member <kind>.name of run, valid from now for ttl
// (DefaultSandboxTTL when 0), with a new user key, and the user's public key.
func (s *Signer) Mint(run, name string, ttl time.Duration, now time.Time) ([]byte, string, error) {
	if ttl == 0 {
		ttl = DefaultSandboxTTL
	}
	return mint(s.key, s.account, s.kind, run, name, ttl, now)
}

// mint makes a user of kind named name in run, signed by the scoped key kp of account.
func mint(kp nkeys.KeyPair, account string, kind events.MemberKind, run, name string, ttl time.Duration, now time.Time) ([]byte, string, error) {
	if err := events.ValidateRun(run); err != nil {
		return nil, "", fmt.Errorf("%w: %w", ErrNotMember, err)
	}
	if err := events.ValidateToken("name", name); err != nil {
		return nil, "", fmt.Errorf("%w: %w", ErrNotMember, err)
	}
	if run != strings.ToLower(run) {
		return nil, "", fmt.Errorf("%w: run %q: with credentials of its own, a run id must be lower case (NATS JWT tags are)", ErrNotMember, run)
	}
	if kind != events.KindSandbox && (strings.Contains(run, "_") || strings.Contains(name, "_")) {
		return nil, "", fmt.Errorf("%w: %s.%s of run %s: with credentials of its own, an agent's or owner's run and name have no underscore", ErrNotMember, kind, name, run)
	}
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return nil, "", fmt.Errorf("embedded: new user key: %w", err)
	}
	defer ukp.Wipe()
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.Name = name
	uc.IssuerAccount = account
	uc.Tags.Add("run:"+run, "kind:"+string(kind))
	uc.IssuedAt = now.Unix()
	if ttl > 0 {
		uc.Expires = now.Add(ttl).Unix()
	}
	uc.SetScoped(true)
	token, err := uc.Encode(kp)
	if err != nil {
		return nil, "", fmt.Errorf("embedded: user JWT of %s.%s: %w", kind, name, err)
	}
	seed, _ := ukp.Seed()
	defer clear(seed)
	creds, err := jwt.FormatUserConfig(token, seed)
	if err != nil {
		return nil, "", fmt.Errorf("embedded: creds of %s.%s: %w", kind, name, err)
	}
	return creds, upub, nil
}

// loadOrCreateKey returns the key pair whose seed is in path, creating the file with a new seed of
// kind prefix if it does not exist.
func loadOrCreateKey(path string, prefix nkeys.PrefixByte) (nkeys.KeyPair, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if err := createKey(path, prefix); err != nil {
			return nil, err
		}
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("embedded: seed file: %w", err)
	}
	defer clear(b)
	kp, err := nkeys.ParseDecoratedNKey(b)
	if err != nil {
		return nil, fmt.Errorf("embedded: seed file %s: %w", path, err)
	}
	if p, err := kp.PublicKey(); err != nil || nkeys.Prefix(p) != prefix {
		return nil, fmt.Errorf("embedded: seed file %s: not the seed of a %s key", path, prefix)
	}
	return kp, nil
}

func createKey(path string, prefix nkeys.PrefixByte) error {
	if prefix == nkeys.PrefixByteUser {
		_, err := createSeed(path)
		return err
	}
	kp, err := nkeys.CreatePair(prefix)
	if err != nil {
		return fmt.Errorf("embedded: new %s key: %w", prefix, err)
	}
	defer kp.Wipe()
	seed, err := kp.Seed()
	if err != nil {
		return fmt.Errorf("embedded: new %s key: %w", prefix, err)
	}
	defer clear(seed)
	return writeSeedOnce(path, seed)
}
