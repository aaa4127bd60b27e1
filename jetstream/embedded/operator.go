package embedded

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/atomicfile"
)

// DefaultSandboxTTL is how long a sandbox's user JWT is valid when Signer.Mint is given no
// expiry: its owner renews it well before (SandboxCreds).
const DefaultSandboxTTL = 10 * time.Minute

var (
	// ErrNotMember is returned (wrapped) by Authority.MemberCreds and Signer.Mint for a run or
	// member name that a member's permissions cannot carry: not an id of PROTOCOL §2, an upper-case
	// run (JWT tags are lower case), an underscore in a run or in an agent's or owner's name (its
	// consumer's name would not be member.ConsumerName's), a kind the signer does not sign, or a
	// run other than the signer's.
	ErrNotMember = errors.New("embedded: not a member these credentials can name")
	// ErrNoRun is returned (wrapped) for a run the authority has no account of.
	ErrNoRun = errors.New("embedded: no account of this run")
)

// Authority is the decentralized auth of one bus (NATS operator mode): an operator, a system
// account, and an account of each run, of which every client of that run is a user. A run's
// account holds its own streams and buckets (the server provisions them in it), so the server
// keeps runs apart: no user of one run can reach, deduplicate against, list or slow another's.
// Users are minted as JWTs: the bridge, controller and admin roles of a run with RolePermissions
// by its account's signing key (RoleCreds), and every agent, owner and sandbox by the run's
// scoped signing key of its kind, whose template (MemberPermissions) names the member by the
// user's name, so that whoever holds that key can mint users of that kind in that run and nothing
// more (MemberCreds, Signer). Every key's seed is a file: the operator's and the system account's
// in the authority's directory, a run's in RunDir; LoadAuthority and AddRun make the missing ones.
type Authority struct {
	dir      string
	operator nkeys.KeyPair
	system   nkeys.KeyPair

	mu   sync.Mutex
	runs map[string]*runAccount
}

// runAccount is the account of one run: its keys and its revocations.
type runAccount struct {
	run     string
	dir     string
	account nkeys.KeyPair
	signer  nkeys.KeyPair
	scoped  map[events.MemberKind]nkeys.KeyPair
	revoked map[string]time.Time // user public key → revoked up to then
}

// memberKinds are the kinds with a scoped signing key.
var memberKinds = []events.MemberKind{events.KindAgent, events.KindOwner, events.KindSandbox}

// runsDir is the directory of the runs' accounts in an authority's dir.
const runsDir = "runs"

// RunDir returns the directory of run's account in an authority's dir, dir/runs/<run>: its keys
// (account.nk, signer.nk, <kind>-signer.nk), its account JWT (AccountJWTFile) and its roles'
// credentials (CredsFile).
func RunDir(dir, run string) string {
	return filepath.Join(dir, runsDir, run)
}

// LoadAuthority reads the authority's keys from dir (operator.nk, system.nk) and every run's
// account under dir/runs, creating the missing operator and system keys (dir 0700, files 0600),
// with the revocations each run's account JWT holds (AccountJWTFile).
func LoadAuthority(dir string) (*Authority, error) {
	if dir == "" {
		return nil, fmt.Errorf("%w: LoadAuthority: dir required", ErrInvalidConfig)
	}
	if err := os.MkdirAll(filepath.Join(dir, runsDir), 0o700); err != nil {
		return nil, fmt.Errorf("embedded: auth dir: %w", err)
	}
	a := &Authority{dir: dir, runs: map[string]*runAccount{}}
	var err error
	if a.operator, err = loadOrCreateKey(filepath.Join(dir, "operator.nk"), nkeys.PrefixByteOperator); err != nil {
		return nil, err
	}
	if a.system, err = loadOrCreateKey(filepath.Join(dir, "system.nk"), nkeys.PrefixByteAccount); err != nil {
		return nil, err
	}
	if _, err := a.Reload(); err != nil {
		return nil, err
	}
	return a, nil
}

// Dir returns the authority's directory.
func (a *Authority) Dir() string { return a.dir }

// Reload reads the runs' accounts added under the authority's dir since it last looked (by
// AddRun in another process: `stillpoint creds`) and the revocations written meanwhile, and
// returns the runs it had not known.
func (a *Authority) Reload() ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(a.dir, runsDir))
	if err != nil {
		return nil, fmt.Errorf("embedded: auth dir: %w", err)
	}
	var added []string
	for _, e := range entries {
		run := e.Name()
		if !e.IsDir() || validRun(run) != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(RunDir(a.dir, run), "account.nk")); err != nil {
			continue // being made
		}
		a.mu.Lock()
		ra, known := a.runs[run]
		a.mu.Unlock()
		if !known {
			if ra, err = loadRun(a.dir, run); err != nil {
				return added, err
			}
			added = append(added, run)
		}
		if err := a.loadRevocations(ra); err != nil {
			return added, err
		}
		a.mu.Lock()
		a.runs[run] = ra
		a.mu.Unlock()
	}
	slices.Sort(added)
	return added, nil
}

// Runs returns the runs the authority has an account of, sorted.
func (a *Authority) Runs() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.runs))
	for r := range a.runs {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}

// validRun checks a run id that has an account of its own: a PROTOCOL §2 id, lower case (JWT
// tags are) and without an underscore (its members' consumer and store names join tokens with
// underscores: member.ConsumerName).
func validRun(run string) error {
	if err := events.ValidateRun(run); err != nil {
		return fmt.Errorf("%w: %w", ErrNotMember, err)
	}
	if run != strings.ToLower(run) {
		return fmt.Errorf("%w: run %q: with credentials of its own, a run id must be lower case (NATS JWT tags are)", ErrNotMember, run)
	}
	if strings.Contains(run, "_") {
		return fmt.Errorf("%w: run %q: with credentials of its own, a run id has no underscore", ErrNotMember, run)
	}
	return nil
}

// AddRun makes run's account if the authority has none (its keys in RunDir, mode 0600) and writes
// what the run's processes take: its account JWT (AccountJWTFile, which a server on the dir picks
// up, provisioning the run's bus in it) and the credentials of its bridge, controller and admin
// (CredsFile). Its owners mint their sandboxes' users through the server (ServeMint): no signing
// key leaves the authority. It is idempotent.
func (a *Authority) AddRun(run string) error {
	if err := validRun(run); err != nil {
		return err
	}
	a.mu.Lock()
	_, known := a.runs[run]
	a.mu.Unlock()
	if known {
		return nil
	}
	ra, err := loadRun(a.dir, run)
	if err != nil {
		return err
	}
	if err := a.loadRevocations(ra); err != nil {
		return err
	}
	a.mu.Lock()
	a.runs[run] = ra
	a.mu.Unlock()
	for _, role := range []Role{RoleBridge, RoleController, RoleAdmin} {
		b, err := a.RoleCreds(role, run)
		if err != nil {
			return err
		}
		err = atomicfile.Write(CredsFile(ra.dir, role), b, 0o600)
		clear(b)
		if err != nil {
			return fmt.Errorf("embedded: %s creds of run %s: %w", role, run, err)
		}
	}
	// The account JWT last: a server watching the dir takes a run whose JWT is there for one
	// whose credentials are too.
	return a.writeAccountJWT(ra)
}

// loadRun reads (or makes) the keys of run's account in RunDir(dir, run).
func loadRun(dir, run string) (*runAccount, error) {
	rd := RunDir(dir, run)
	if err := os.MkdirAll(rd, 0o700); err != nil {
		return nil, fmt.Errorf("embedded: run %s: %w", run, err)
	}
	ra := &runAccount{run: run, dir: rd, scoped: map[events.MemberKind]nkeys.KeyPair{}, revoked: map[string]time.Time{}}
	var err error
	// The scoped keys and the signer first, the account key last: Reload takes a run whose
	// account key is there for one whose keys all are.
	for _, k := range memberKinds {
		if ra.scoped[k], err = loadOrCreateKey(filepath.Join(rd, string(k)+"-signer.nk"), nkeys.PrefixByteAccount); err != nil {
			return nil, err
		}
	}
	if ra.signer, err = loadOrCreateKey(filepath.Join(rd, "signer.nk"), nkeys.PrefixByteAccount); err != nil {
		return nil, err
	}
	if ra.account, err = loadOrCreateKey(filepath.Join(rd, "account.nk"), nkeys.PrefixByteAccount); err != nil {
		return nil, err
	}
	return ra, nil
}

// run returns run's account, or ErrNoRun.
func (a *Authority) run(run string) (*runAccount, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ra, ok := a.runs[run]
	if !ok {
		return nil, fmt.Errorf("%w: %q (stillpoint creds --run makes it)", ErrNoRun, run)
	}
	return ra, nil
}

// AccountJWTFile returns the path of the account JWT of the run whose directory is runDir
// (RunDir): AddRun writes it, Revoke re-signs it with every revocation, LoadAuthority reads the
// revocations back from it (so a server restarted on the dir still refuses them), and a server on
// the dir applies it when it changes.
func AccountJWTFile(runDir string) string {
	return filepath.Join(runDir, "account.jwt")
}

// loadRevocations adds the revocations of ra's account JWT file to ra's (the later time of the
// two for a user in both). No file is none. A file that is not this account's JWT signed by this
// operator is an error: a revocation must not be lost silently.
func (a *Authority) loadRevocations(ra *runAccount) error {
	path := AccountJWTFile(ra.dir)
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
	apub, _ := ra.account.PublicKey()
	opub, _ := a.operator.PublicKey()
	if ac.Subject != apub || ac.Issuer != opub {
		return fmt.Errorf("embedded: account JWT %s: account %s signed by %s, want account %s signed by operator %s",
			path, ac.Subject, ac.Issuer, apub, opub)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for user, at := range ac.Revocations {
		if t := time.Unix(at, 0); t.After(ra.revoked[user]) {
			ra.revoked[user] = t
		}
	}
	return nil
}

// SignerFile returns the path of kind's scoped signing key seed in the directory of a run's
// account (RunDir): <runDir>/<kind>-signer.nk.
func SignerFile(runDir string, kind events.MemberKind) string {
	return filepath.Join(runDir, string(kind)+"-signer.nk")
}

// CredsFile returns the path of role's credentials in dir: dir/<role>.creds. Under decentralized
// auth dir is a run's RunDir, where AddRun writes them.
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

// Trust returns the JWTs a server trusts the authority's users with (Config.Trust): the
// operator's, the system account's and every run's account the authority knows. A run added
// later reaches a running server through Server.UpdateAccount (WatchRuns).
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
	t := &Trust{Operator: ojwt, SystemAccount: spub, Accounts: map[string]string{spub: sjwt}}
	for _, run := range a.Runs() {
		ra, _ := a.run(run)
		ajwt, err := a.accountJWT(ra)
		if err != nil {
			return nil, err
		}
		apub, _ := ra.account.PublicKey()
		t.Accounts[apub] = ajwt
	}
	return t, nil
}

// AccountJWT returns the JWT of run's account: JetStream within the run's limits, the signing key
// of its roles, one scoped signing key per member kind with MemberPermissions of the run as its
// template, and the users revoked so far (Revoke).
func (a *Authority) AccountJWT(run string) (string, error) {
	ra, err := a.run(run)
	if err != nil {
		return "", err
	}
	return a.accountJWT(ra)
}

func (a *Authority) accountJWT(ra *runAccount) (string, error) {
	apub, _ := ra.account.PublicKey()
	ac := jwt.NewAccountClaims(apub)
	ac.Name = ra.run
	lim := a.Limits()
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: lim.Storage, Streams: -1, Consumer: lim.Consumers,
		MaxAckPending: -1, MemoryMaxStreamBytes: -1, DiskMaxStreamBytes: -1}
	ac.Limits.Conn = lim.Connections
	if lim.Storage > 0 {
		// A memory stream (a test's) counts against the same bound.
		ac.Limits.JetStreamLimits.MemoryStorage = lim.Storage
	}
	spub, _ := ra.signer.PublicKey()
	ac.SigningKeys.Add(spub)
	for _, k := range memberKinds {
		kpub, _ := ra.scoped[k].PublicKey()
		scope := jwt.NewUserScope()
		scope.Key = kpub
		scope.Role = string(k)
		scope.Description = "users of member kind " + string(k) + " of run " + ra.run + ", each named after its member"
		p := MemberPermissions(k, ra.run, nameTemplate)
		scope.Template.Pub = jwt.Permission{Allow: p.Publish.Allow, Deny: p.Publish.Deny}
		scope.Template.Sub = jwt.Permission{Allow: p.Subscribe.Allow, Deny: p.Subscribe.Deny}
		scope.Template.Limits.NatsLimits = memberLimits(k)
		ac.SigningKeys.AddScopedSigner(scope)
	}
	a.mu.Lock()
	for user, at := range ra.revoked {
		ac.RevokeAt(user, at)
	}
	a.mu.Unlock()
	s, err := ac.Encode(a.operator)
	if err != nil {
		return "", fmt.Errorf("embedded: account JWT of run %s: %w", ra.run, err)
	}
	return s, nil
}

// writeAccountJWT writes ra's account JWT to its AccountJWTFile.
func (a *Authority) writeAccountJWT(ra *runAccount) error {
	ajwt, err := a.accountJWT(ra)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(AccountJWTFile(ra.dir), []byte(ajwt+"\n"), 0o600); err != nil {
		return fmt.Errorf("embedded: account JWT: %w", err)
	}
	return nil
}

// Revoke revokes every JWT of user (a public user key) of run issued up to now. The run's
// AccountJWT carries it from then on, and Server.UpdateAccount gives it to a running server,
// which disconnects the user. It is kept in the run's dir too: Revoke writes AccountJWTFile,
// re-signed with every revocation (its own, and those another process on the dir wrote
// meanwhile), before it returns, and LoadAuthority reads them back, so a server restarted on the
// dir refuses the user still.
func (a *Authority) Revoke(run, user string) error {
	if !nkeys.IsValidPublicUserKey(user) {
		return fmt.Errorf("%w: Revoke: %q is not a user's public key", ErrInvalidConfig, user)
	}
	ra, err := a.run(run)
	if err != nil {
		return err
	}
	if err := a.loadRevocations(ra); err != nil {
		return err
	}
	a.mu.Lock()
	ra.revoked[user] = time.Now()
	a.mu.Unlock()
	return a.writeAccountJWT(ra)
}

// RoleCreds mints the credentials (a .creds file's bytes) of role, one of bridge, controller and
// admin, of run, with RolePermissions(role, run) and no expiry: one user for every process of the
// role, its seed in RunDir/<role>.nk (made if missing). A member role has no such user: each
// member gets its own (MemberCreds).
func (a *Authority) RoleCreds(role Role, run string) ([]byte, error) {
	switch role {
	case RoleBridge, RoleController, RoleAdmin:
	default:
		return nil, fmt.Errorf("%w: RoleCreds: role %q: want bridge, controller or admin (members get their own, MemberCreds)", ErrInvalidConfig, role)
	}
	ra, err := a.run(run)
	if err != nil {
		return nil, err
	}
	perms, err := RolePermissions(role, run)
	if err != nil {
		return nil, err
	}
	ukp, err := loadOrCreateKey(SeedFile(ra.dir, role), nkeys.PrefixByteUser)
	if err != nil {
		return nil, err
	}
	defer ukp.Wipe()
	upub, _ := ukp.PublicKey()
	apub, _ := ra.account.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.Name = string(role)
	uc.IssuerAccount = apub
	uc.Tags.Add("run:" + run)
	if role == RoleBridge {
		// In its run's account the bridge makes the members' own records stores, and the
		// agents' own trajectories stores, when they ask (jetstream.ServeStores); a member
		// makes no stream.
		perms.Publish.Allow = append(perms.Publish.Allow, "$JS.API.STREAM.CREATE.*")
	}
	if perms != nil {
		uc.Pub = jwt.Permission{Allow: perms.Publish.Allow, Deny: perms.Publish.Deny}
		uc.Sub = jwt.Permission{Allow: perms.Subscribe.Allow, Deny: perms.Subscribe.Deny}
	}
	token, err := uc.Encode(ra.signer)
	if err != nil {
		return nil, fmt.Errorf("embedded: %s JWT: %w", role, err)
	}
	seed, _ := ukp.Seed()
	defer clear(seed)
	return jwt.FormatUserConfig(token, seed)
}

// MemberCreds mints the credentials of member m of run with the run's scoped signing key of m's
// kind, valid for ttl (0: no expiry), with a new user key, making the run's account first if the
// authority has none (AddRun). It returns the .creds bytes and the user's public key (for
// Revoke).
func (a *Authority) MemberCreds(run string, m events.Member, ttl time.Duration) ([]byte, string, error) {
	if err := m.Validate(); err != nil {
		return nil, "", fmt.Errorf("%w: %w", ErrNotMember, err)
	}
	if err := a.AddRun(run); err != nil {
		return nil, "", err
	}
	ra, err := a.run(run)
	if err != nil {
		return nil, "", err
	}
	kp, ok := ra.scoped[m.Kind()]
	if !ok {
		return nil, "", fmt.Errorf("%w: %s: kind %s has no users of its own", ErrNotMember, m, m.Kind())
	}
	apub, _ := ra.account.PublicKey()
	return mint(kp, apub, m.Kind(), run, m.Name(), ttl, time.Now())
}

// Signer is the scoped signing key of one member kind of one run, as its file holds it
// (WriteSigner): the key, the run and the account it signs for. An owner holds the sandbox kind's
// to mint each of its sandboxes a user of its own (Mint); the account's template limits what
// those users may do, whatever the holder asks, and the account is the run's alone.
type Signer struct {
	kind    events.MemberKind
	run     string
	account string
	key     nkeys.KeyPair
}

// signerFile is the JSON of a signer file.
type signerFile struct {
	Kind    events.MemberKind `json:"kind"`
	Run     string            `json:"run"`
	Account string            `json:"account"`
	Seed    string            `json:"seed"`
}

// WriteSigner writes the signer file of run's scoped signing key of kind to path (mode 0600),
// for LoadSigner.
func (a *Authority) WriteSigner(run string, kind events.MemberKind, path string) error {
	ra, err := a.run(run)
	if err != nil {
		return err
	}
	kp, ok := ra.scoped[kind]
	if !ok {
		return fmt.Errorf("%w: WriteSigner: kind %q has no scoped signing key", ErrInvalidConfig, kind)
	}
	seed, _ := kp.Seed() // the key's own bytes: not to be cleared here
	apub, _ := ra.account.PublicKey()
	b, err := json.Marshal(signerFile{Kind: kind, Run: run, Account: apub, Seed: string(seed)})
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
	if err := validRun(f.Run); err != nil {
		return nil, fmt.Errorf("embedded: signer file %s: %w", path, err)
	}
	kp, err := nkeys.FromSeed([]byte(f.Seed))
	if err != nil {
		return nil, fmt.Errorf("embedded: signer file %s: %w", path, err)
	}
	if pub, _ := kp.PublicKey(); !nkeys.IsValidPublicAccountKey(pub) {
		return nil, fmt.Errorf("embedded: signer file %s: not an account signing key", path)
	}
	return &Signer{kind: f.Kind, run: f.Run, account: f.Account, key: kp}, nil
}

// Kind returns the member kind the signer mints users of.
func (s *Signer) Kind() events.MemberKind { return s.kind }

// Run returns the run the signer mints users of.
func (s *Signer) Run() string { return s.run }

// Mint returns the credentials of member <kind>.name of run (the signer's), valid from now for
// ttl (DefaultSandboxTTL when 0), with a new user key, and the user's public key.
func (s *Signer) Mint(run, name string, ttl time.Duration, now time.Time) ([]byte, string, error) {
	if run != s.run {
		return nil, "", fmt.Errorf("%w: run %q: this signer mints users of run %q only", ErrNotMember, run, s.run)
	}
	if ttl == 0 {
		ttl = DefaultSandboxTTL
	}
	return mint(s.key, s.account, s.kind, run, name, ttl, now)
}

// mint makes a user of kind named name in run, signed by the scoped key kp of account.
func mint(kp nkeys.KeyPair, account string, kind events.MemberKind, run, name string, ttl time.Duration, now time.Time) ([]byte, string, error) {
	if err := validRun(run); err != nil {
		return nil, "", err
	}
	if err := events.ValidateToken("name", name); err != nil {
		return nil, "", fmt.Errorf("%w: %w", ErrNotMember, err)
	}
	if kind != events.KindSandbox && strings.Contains(name, "_") {
		return nil, "", fmt.Errorf("%w: %s.%s of run %s: with credentials of its own, an agent's or owner's name has no underscore", ErrNotMember, kind, name, run)
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
