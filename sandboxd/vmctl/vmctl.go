package vmctl

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// PortName is the name of the virtio-serial port of the control channel
// (QEMU: -device virtserialport,chardev=...,name=stillpoint.ctl).
const PortName = "stillpoint.ctl"

// GuestPath is where the guest finds the port.
const GuestPath = "/dev/virtio-ports/" + PortName

// MaxLine bounds one line either way (an exec's output or a file of an
// identify travels in one line, base64).
const MaxLine = 64 << 20

// MaxOutput bounds each of an exec's Stdout and Stderr: both, in base64,
// fit in one MaxLine.
const MaxOutput = 16 << 20

// EntropyBytes is how many bytes of entropy an identify or reidentify
// carries.
const EntropyBytes = 64

// ErrProtocol is returned for a line that breaks this contract: not JSON,
// too long, no id or op, an unknown op, or an op's field missing.
var ErrProtocol = errors.New("vmctl: protocol error")

// Op names a request.
type Op string

// The ops (i14 control protocol).
const (
	// OpHello asks the guest's state: Response.Hello.
	OpHello Op = "hello"
	// OpIdentify gives a template its identity: Request.Identity.
	OpIdentify Op = "identify"
	// OpReidentify gives a fork a new identity and the restore's epoch:
	// Request.Identity with Epoch.
	OpReidentify Op = "reidentify"
	// OpExec runs a command and waits for it: Request.Exec,
	// Response.Exec.
	OpExec Op = "exec"
	// OpLease renews the lease: Request.UntilMS.
	OpLease Op = "lease"
	// OpClock sets the guest's realtime clock: Request.Wall.
	OpClock Op = "clock"
	// OpSync flushes the guest's file systems (before a snapshot's stop).
	OpSync Op = "sync"
)

// State is what a guest is.
type State string

// The guest states.
const (
	// StateTemplate waits for its identity: nothing of a sandbox is in it.
	StateTemplate State = "template"
	// StateIdentified runs sandboxd as a member of a run.
	StateIdentified State = "identified"
)

// Identity names one process for as long as the guest runs: its pid and
// its start time in clock ticks since boot (the shape of
// sandboxapi.Identity).
type Identity struct {
	// PID is the process id.
	PID int `json:"pid"`
	// Start is the process start time in clock ticks since boot.
	Start uint64 `json:"start"`
}

// File is a file an identify writes.
type File struct {
	// Path is the file's path in the guest's root: absolute, or relative
	// to the root. Parent directories are created (0755).
	Path string `json:"path"`
	// Mode is the permission bits (default 0644).
	Mode uint32 `json:"mode,omitempty"`
	// Data is the content (base64 on the wire).
	Data []byte `json:"data"`
}

// Request is one line from the host. Every op's fields are in this one
// flat struct (each name once), set only for that op.
type Request struct {
	// ID is echoed in the Response. Required, not 0.
	ID uint64 `json:"id"`
	// Op is the operation. Required.
	Op Op `json:"op"`

	// Identify and reidentify.

	// Sandbox is the sandbox id: the member is sandbox.<Sandbox>.
	Sandbox string `json:"sandbox,omitempty"`
	// Run is the run id.
	Run string `json:"run,omitempty"`
	// NATSURL is the server as the guest reaches it (a guestfwd address).
	NATSURL string `json:"nats_url,omitempty"`
	// Creds, when set, is written to /etc/stillpoint/nats.creds and used.
	Creds []byte `json:"creds,omitempty"`
	// Entropy is EntropyBytes of fresh randomness for the kernel RNG.
	Entropy []byte `json:"entropy,omitempty"`
	// Wall is the host's time (identify: set when SetClock; clock: set).
	Wall time.Time `json:"wall,omitzero"`
	// SetClock sets the guest's realtime clock to Wall.
	SetClock bool `json:"set_clock,omitempty"`
	// Workdir is the sandbox's working directory.
	Workdir string `json:"workdir,omitempty"`
	// Env is the environment (identify: sandboxd's and its launches'; exec:
	// the command's).
	Env []string `json:"env,omitempty"`
	// Files are written before sandboxd starts.
	Files []File `json:"files,omitempty"`
	// Args are more `sandboxd member` flags; Sandbox, Run and NATSURL
	// override --id, --run and --nats-url.
	Args []string `json:"args,omitempty"`
	// Init, when Run is empty, is the sandbox's first process instead of
	// sandboxd member: started in the root with Workdir and Env, kept
	// across forks (same pid), reported as Hello.InitPID. A reidentify
	// without Run only reseeds, sets the clock and writes the files.
	Init []string `json:"init,omitempty"`
	// LeaseMS, when positive, is the lease from now, in milliseconds.
	LeaseMS int64 `json:"lease_ms,omitempty"`
	// Epoch is the restore's (or branch's) epoch a reidentified sandboxd
	// moves to (PROTOCOL §5, the adopted sandbox daemon); 0, a branch in
	// the run's first epoch: it takes the epoch from the phases.
	Epoch uint64 `json:"epoch,omitempty"`

	// Exec.

	// Argv is the command. Required for exec.
	Argv []string `json:"argv,omitempty"`
	// Dir is its working directory (default /).
	Dir string `json:"dir,omitempty"`
	// TimeoutMS, when positive, kills the command's process group after it.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Stdin is the command's standard input (default empty).
	Stdin []byte `json:"stdin,omitempty"`

	// Lease.

	// UntilMS is the lease from now, in milliseconds. Required for lease.
	UntilMS int64 `json:"until_ms,omitempty"`
}

// Validate checks the request's id, op and the fields its op needs; the
// errors, joined, wrap ErrProtocol.
func (r Request) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrProtocol}, args...)...))
	}
	if r.ID == 0 {
		bad("id: required")
	}
	switch r.Op {
	case OpHello, OpSync:
	case OpIdentify, OpReidentify:
		switch {
		case r.Sandbox == "":
			bad("%s: sandbox is required", r.Op)
		case r.Run != "" && r.NATSURL == "":
			bad("%s: nats_url is required with run", r.Op)
		case r.Run == "" && r.Op == OpIdentify && len(r.Init) == 0:
			bad("identify: run (sandboxd member) or init is required")
		case r.Run != "" && len(r.Init) > 0:
			bad("%s: run and init are exclusive", r.Op)
		}
		if len(r.Entropy) < EntropyBytes {
			bad("%s: entropy: %d bytes, want %d", r.Op, len(r.Entropy), EntropyBytes)
		}
		if r.SetClock && r.Wall.IsZero() {
			bad("%s: set_clock without wall", r.Op)
		}
		if r.LeaseMS < 0 {
			bad("%s: lease_ms %d is negative", r.Op, r.LeaseMS)
		}
	case OpExec:
		if len(r.Argv) == 0 || r.Argv[0] == "" {
			bad("exec: argv is required")
		}
		if r.TimeoutMS < 0 {
			bad("exec: timeout_ms %d is negative", r.TimeoutMS)
		}
	case OpLease:
		if r.UntilMS <= 0 {
			bad("lease: until_ms must be positive")
		}
	case OpClock:
		if r.Wall.IsZero() {
			bad("clock: wall is required")
		}
	case "":
		bad("op: required")
	default:
		bad("op %q: unknown", r.Op)
	}
	return errors.Join(errs...)
}

// Hello is the guest's answer to OpHello.
type Hello struct {
	// State is template or identified.
	State State `json:"state"`
	// Sandbox and Run are the identity, once identified.
	Sandbox string `json:"sandbox,omitempty"`
	Run     string `json:"run,omitempty"`
	// Member is the bus member, once identified: sandbox.<Sandbox>.
	Member string `json:"member,omitempty"`
	// BootID is the kernel's boot id (/proc/sys/kernel/random/boot_id): a
	// fork keeps its snapshot's.
	BootID string `json:"boot_id,omitempty"`
	// Identity is sandboxd's (PID 1).
	Identity Identity `json:"identity"`
	// InitPID is the pid of Identify.Init, when the sandbox runs one.
	InitPID int `json:"init_pid,omitempty"`
	// InitExited says the plain init exited (EventInit).
	InitExited bool `json:"init_exited,omitempty"`
	// Uptime is CLOCK_BOOTTIME in seconds: continuous from the snapshot in
	// a fork.
	Uptime float64 `json:"uptime"`
	// Wall is the guest's realtime clock.
	Wall time.Time `json:"wall"`
	// Epoch is the epoch an adopted member serves from the start (after a
	// reidentify); 0 otherwise.
	Epoch uint64 `json:"epoch,omitempty"`
}

// ExecResult is the guest's answer to OpExec.
type ExecResult struct {
	// Exit is the exit code, -1 when a signal killed the command.
	Exit int `json:"exit"`
	// Signal names the signal that killed it.
	Signal string `json:"signal,omitempty"`
	// TimedOut says the timeout killed it.
	TimedOut bool `json:"timed_out,omitempty"`
	// Stdout and Stderr are its output (base64 on the wire), each cut
	// at MaxOutput bytes.
	Stdout []byte `json:"stdout"`
	Stderr []byte `json:"stderr"`
	// Truncated says Stdout or Stderr was cut at MaxOutput (the rest of
	// the output was read and dropped).
	Truncated bool `json:"truncated,omitempty"`
}

// Response is the guest's answer to one Request.
type Response struct {
	// ID is the request's; 0 in the refusal of a line that did not decode.
	ID uint64 `json:"id"`
	// OK says the op was done; Error says why not.
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	// Hello answers OpHello, and identify and reidentify once the member
	// joined (flattened).
	*Hello
	// Exec answers OpExec (flattened).
	*ExecResult
}

// Event names a line the guest sends of its own.
type Event string

// The events.
const (
	// EventReady: the guest waits for its identity (State template).
	EventReady Event = "ready"
	// EventPowerOff: the lease ran out; the guest syncs and powers off.
	EventPowerOff Event = "poweroff"
	// EventLog: a message for the owner's log.
	EventLog Event = "log"
	// EventMember: the sandboxd member stopped (Why says why).
	EventMember Event = "member"
	// EventInit: the plain init (Identify.Init) exited; Why is "exit N"
	// or "signal NAME". Hello.InitExited says so too, for a host that was
	// not connected then.
	EventInit Event = "init"
)

// Notice is an event line.
type Notice struct {
	// Event names it. Required.
	Event Event `json:"event"`
	// State is the guest's state (ready).
	State State `json:"state,omitempty"`
	// Why says what happened (poweroff, member).
	Why string `json:"why,omitempty"`
	// Level and Msg are a log line.
	Level string `json:"level,omitempty"`
	Msg   string `json:"msg,omitempty"`
}

// DecodeRequest decodes and validates one host line.
func DecodeRequest(line []byte) (Request, error) {
	var r Request
	if err := json.Unmarshal(line, &r); err != nil {
		return Request{}, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	return r, r.Validate()
}

// DecodeGuestLine decodes one guest line: a Notice when it has "event",
// else a Response.
func DecodeGuestLine(line []byte) (*Response, *Notice, error) {
	var probe struct {
		Event *string `json:"event"`
	}
	if err := json.Unmarshal(line, &probe); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	if probe.Event != nil {
		var n Notice
		if err := json.Unmarshal(line, &n); err != nil {
			return nil, nil, fmt.Errorf("%w: %w", ErrProtocol, err)
		}
		return nil, &n, nil
	}
	var r Response
	if err := json.Unmarshal(line, &r); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	if r.ID == 0 && r.OK {
		// ID 0 is only the refusal of a line the guest could not read.
		return nil, nil, fmt.Errorf("%w: a response without id", ErrProtocol)
	}
	return &r, nil, nil
}

// Encode returns v as one line: JSON and a newline. An exec answer whose
// output alone would not fit is refused before it is encoded: encoding
// tens of MiB in base64 takes seconds of a guest's CPU, minutes under
// TCG, for a line that cannot be sent.
func Encode(v any) ([]byte, error) {
	if n := outputLen(v); n > MaxLine {
		return nil, fmt.Errorf("%w: a line of more than %d bytes, limit %d", ErrProtocol, n, MaxLine)
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	if b.Len() > MaxLine {
		return nil, fmt.Errorf("%w: a line of %d bytes, limit %d", ErrProtocol, b.Len(), MaxLine)
	}
	return b.Bytes(), nil
}

// outputLen is the length in base64 of an exec answer's output, the part
// of a line that can exceed MaxLine (0 for anything else).
func outputLen(v any) int {
	var x *ExecResult
	switch r := v.(type) {
	case Response:
		x = r.ExecResult
	case *Response:
		if r != nil {
			x = r.ExecResult
		}
	}
	if x == nil {
		return 0
	}
	return base64.StdEncoding.EncodedLen(len(x.Stdout)) + base64.StdEncoding.EncodedLen(len(x.Stderr))
}
