package events

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

var capabilityRE = regexp.MustCompile(`^[a-z][a-z0-9_.:-]{0,63}$`)

// MemberJoined announces a member to its run. Liveness itself is the
// member's heartbeat key in sp_members; this event is the audit record.
type MemberJoined struct {
	// Run is the run id.
	Run string `json:"run"`
	// Member is the member that joined.
	Member Member `json:"member"`
	// Epoch is the epoch the member serves.
	Epoch uint64 `json:"epoch"`
	// Capabilities say what the member can do, e.g. "pause:freeze",
	// "snapshot", "restart_only".
	Capabilities []string `json:"capabilities,omitempty"`
	// Host and PID say where it runs.
	Host string `json:"host,omitempty"`
	PID  int    `json:"pid,omitempty"`
	// Version is the member's build version.
	Version string `json:"version,omitempty"`
}

// CapabilityOwner prefixes the capability by which an agent names the
// sandbox owner its rollouts use ("owner:o1"): whoever watches the fleet
// then knows which owner's restart loses that agent's rollouts.
const CapabilityOwner = "owner:"

// ValidCapability tells whether c is a well-formed capability.
func ValidCapability(c string) bool { return capabilityRE.MatchString(c) }

// OwnerOf returns the owner an agent's capabilities name, if any.
func OwnerOf(capabilities []string) (Member, bool) {
	for _, c := range capabilities {
		if n, ok := strings.CutPrefix(c, CapabilityOwner); ok {
			return Member(string(KindOwner) + "." + n), true
		}
	}
	return "", false
}

// Type implements Data.
func (MemberJoined) Type() Type { return TypeMemberJoined }

// Validate implements Data.
func (m MemberJoined) Validate() error {
	errs := []error{prefixField("data.", ValidateRun(m.Run)), validateMember("data.member", string(m.Member))}
	if len(m.Capabilities) > 64 {
		errs = append(errs, fieldErr("data.capabilities", ErrTooLarge, "%d entries, limit 64", len(m.Capabilities)))
	}
	for i, c := range m.Capabilities {
		if !capabilityRE.MatchString(c) {
			errs = append(errs, fieldErr(fmt.Sprintf("data.capabilities[%d]", i), ErrInvalid, "%q must match %s", clip(c), capabilityRE))
			break
		}
	}
	if len(m.Host) > 255 || len(m.Version) > 255 {
		errs = append(errs, fieldErr("data.host", ErrTooLarge, "host and version are limited to 255 bytes"))
	}
	return errors.Join(errs...)
}

func (m MemberJoined) route() route {
	return route{run: m.Run, subject: string(m.Member), nats: MemberSubject(m.Run, m.Member), source: m.Member, epoch: m.Epoch}
}

// MemberLeft records that a member left its run on purpose.
type MemberLeft struct {
	// Run is the run id.
	Run string `json:"run"`
	// Member is the member that left.
	Member Member `json:"member"`
	// Epoch is the epoch the member served.
	Epoch uint64 `json:"epoch"`
	// Reason says why, e.g. "shutdown" or "superseded".
	Reason string `json:"reason,omitempty"`
}

// Type implements Data.
func (MemberLeft) Type() Type { return TypeMemberLeft }

// Validate implements Data.
func (m MemberLeft) Validate() error {
	errs := []error{prefixField("data.", ValidateRun(m.Run)), validateMember("data.member", string(m.Member))}
	if len(m.Reason) > MaxDetail {
		errs = append(errs, fieldErr("data.reason", ErrTooLarge, "%d bytes, limit %d", len(m.Reason), MaxDetail))
	}
	return errors.Join(errs...)
}

func (m MemberLeft) route() route {
	return route{run: m.Run, subject: string(m.Member), nats: MemberSubject(m.Run, m.Member), source: m.Member, epoch: m.Epoch}
}
