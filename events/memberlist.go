package events

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// The member list of a checkpoint (PROTOCOL §3, schema 2): every member
// manifest its commit acks carried, gathered by the bridge into one
// object of the bridge's object store (sp_checkpoints), which the KV
// checkpoint manifest names with its digest. The KV value stays a few
// hundred bytes at any member count; the list is as large as it must be.

// MemberListSchema is the schema version of member list objects.
const MemberListSchema = 1

// MemberList is the content of a member list object: the member
// manifests of one checkpoint, sorted by member, one per member.
type MemberList struct {
	// Schema is MemberListSchema.
	Schema int `json:"schema"`
	// Run and CheckpointID say whose list this is.
	Run          string `json:"run"`
	CheckpointID string `json:"checkpoint_id"`
	// Members are the member manifests, sorted by member.
	Members []MemberManifest `json:"members"`
	// Committed names every member that committed, sorted: those of
	// Members and those that exported nothing (no manifest).
	Committed []Member `json:"committed,omitempty"`
}

// MemberListRef is how a schema-2 checkpoint manifest names its member
// list: the object in sp_checkpoints, the sha256 (hex) and size of its
// bytes, and the number of member manifests it holds.
type MemberListRef struct {
	Object string `json:"object"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	Count  int    `json:"count"`
}

// Validate checks the reference against the checkpoint it belongs to.
func (r MemberListRef) Validate(run, checkpoint string) error {
	var errs []error
	if !isSHA256(r.SHA256) {
		errs = append(errs, fieldErr("member_list.sha256", ErrInvalid, "%q is not a hex sha256", clip(r.SHA256)))
	} else if want := MemberListObject(run, checkpoint, r.SHA256); r.Object != want {
		errs = append(errs, fieldErr("member_list.object", ErrMismatch, "%q, want %q", clip(r.Object), want))
	}
	if r.Count < 0 || r.Size <= 0 {
		errs = append(errs, fieldErr("member_list.size", ErrInvalid, "count %d, size %d", r.Count, r.Size))
	}
	return errors.Join(errs...)
}

// MemberListObject returns the sp_checkpoints object name of a
// checkpoint's member list, named by its content:
// <run>/<checkpoint>/members.<first 16 hex digits of the sha256>.json. As
// with records (RecordsObject), a name fixed by the content is never
// written again with other bytes.
func MemberListObject(run, checkpoint, sha256 string) string {
	if len(sha256) > 16 {
		sha256 = sha256[:16]
	}
	return MemberListPrefix(run, checkpoint) + sha256 + ".json"
}

// MemberListPrefix returns the prefix of every member list object of a
// checkpoint, <run>/<checkpoint>/members.
func MemberListPrefix(run, checkpoint string) string {
	return run + "/" + checkpoint + "/members."
}

// EncodeMemberList returns the member list object of checkpoint: members
// sorted by member and committed (every member of the commit; nil: not
// said) sorted, as JSON, and the reference a checkpoint manifest names it
// with. The bytes depend only on what is given, so a bridge that writes
// the list again (after a crash) writes the same object. A member named
// twice, a manifest of another run or checkpoint, or of a member not in
// committed, is refused.
func EncodeMemberList(run, checkpoint string, committed []Member, members []MemberManifest) ([]byte, MemberListRef, error) {
	list := MemberList{Schema: MemberListSchema, Run: run, CheckpointID: checkpoint, Members: slices.Clone(members), Committed: slices.Clone(committed)}
	if list.Members == nil {
		list.Members = []MemberManifest{}
	}
	slices.SortFunc(list.Members, func(a, b MemberManifest) int { return strings.Compare(string(a.Member), string(b.Member)) })
	slices.Sort(list.Committed)
	if err := list.Validate(); err != nil {
		return nil, MemberListRef{}, err
	}
	b, err := json.Marshal(list)
	if err != nil {
		return nil, MemberListRef{}, fmt.Errorf("events: member list: %w", err)
	}
	sum := sha256.Sum256(b)
	h := hex.EncodeToString(sum[:])
	return b, MemberListRef{Object: MemberListObject(run, checkpoint, h), SHA256: h, Size: int64(len(b)), Count: len(list.Members)}, nil
}

// Validate checks the list: its schema, every manifest (of this run and
// checkpoint), sorted by member with none twice.
func (l MemberList) Validate() error {
	var errs []error
	if l.Schema != MemberListSchema {
		errs = append(errs, fieldErr("member_list.schema", ErrUnknownVersion, "%d, this build reads %d", l.Schema, MemberListSchema))
	}
	errs = append(errs, prefixField("member_list.", errors.Join(ValidateRun(l.Run), ValidateCheckpointID(l.CheckpointID))))
	for i, m := range l.Committed {
		if err := validateMember(fmt.Sprintf("member_list.committed[%d]", i), string(m)); err != nil {
			errs = append(errs, err)
			break
		}
		if i > 0 && l.Committed[i-1] >= m {
			errs = append(errs, fieldErr(fmt.Sprintf("member_list.committed[%d]", i), ErrInvalid, "%s after %s: not sorted, or named twice", m, l.Committed[i-1]))
			break
		}
	}
	for i, m := range l.Members {
		field := fmt.Sprintf("member_list.members[%d]", i)
		if len(l.Committed) > 0 {
			if _, ok := slices.BinarySearch(l.Committed, m.Member); !ok {
				errs = append(errs, fieldErr(field, ErrMismatch, "%s did not commit", m.Member))
				break
			}
		}
		if err := m.Validate(); err != nil {
			errs = append(errs, prefixField(field+".", err))
			break
		}
		if m.Run != l.Run || m.CheckpointID != l.CheckpointID {
			errs = append(errs, fieldErr(field, ErrMismatch, "names %s/%s, the list is %s/%s", m.Run, m.CheckpointID, l.Run, l.CheckpointID))
			break
		}
		if i > 0 && l.Members[i-1].Member >= m.Member {
			errs = append(errs, fieldErr(field, ErrInvalid, "%s after %s: not sorted, or named twice", m.Member, l.Members[i-1].Member))
			break
		}
	}
	return errors.Join(errs...)
}

// DecodeMemberList reads the bytes of the member list that ref names for
// checkpoint of run: their size, sha256 and count must be ref's (else
// ErrMismatch naming each difference), and the list must be valid.
func DecodeMemberList(run, checkpoint string, ref MemberListRef, b []byte) (MemberList, error) {
	if err := ref.Validate(run, checkpoint); err != nil {
		return MemberList{}, err
	}
	var diffs []string
	if int64(len(b)) != ref.Size {
		diffs = append(diffs, fmt.Sprintf("size %d, the manifest says %d", len(b), ref.Size))
	}
	sum := sha256.Sum256(b)
	if h := hex.EncodeToString(sum[:]); h != ref.SHA256 {
		diffs = append(diffs, fmt.Sprintf("sha256 %s, the manifest says %s", h, ref.SHA256))
	}
	if len(diffs) > 0 {
		return MemberList{}, fieldErr("member_list", ErrMismatch, "%s: %s", ref.Object, strings.Join(diffs, "; "))
	}
	var list MemberList
	if err := json.Unmarshal(b, &list); err != nil {
		return MemberList{}, fieldErr("member_list", ErrMalformed, "%s: %v", ref.Object, err)
	}
	if err := list.Validate(); err != nil {
		return MemberList{}, err
	}
	if list.Run != run || list.CheckpointID != checkpoint {
		return MemberList{}, fieldErr("member_list", ErrMismatch, "%s names %s/%s", ref.Object, list.Run, list.CheckpointID)
	}
	if len(list.Members) != ref.Count {
		return MemberList{}, fieldErr("member_list.count", ErrMismatch, "%s holds %d members, the manifest says %d", ref.Object, len(list.Members), ref.Count)
	}
	return list, nil
}

// LoadMembers fills Members (and Committed) of a committed schema-2
// manifest from its member list, whose bytes get returns by object name,
// verified (DecodeMemberList). A schema-1 manifest (inline members) and an abort
// marker are left as they are.
func (c *CheckpointManifest) LoadMembers(get func(object string) ([]byte, error)) error {
	if c.Schema == CheckpointSchemaInline || c.MemberList == nil {
		return nil
	}
	b, err := get(c.MemberList.Object)
	if err != nil {
		return fmt.Errorf("events: member list %s of checkpoint %s: %w", c.MemberList.Object, c.CheckpointID, err)
	}
	list, err := DecodeMemberList(c.Run, c.CheckpointID, *c.MemberList, b)
	if err != nil {
		return err
	}
	c.Members, c.Committed = list.Members, list.Committed
	return nil
}
