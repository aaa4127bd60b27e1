package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func listManifest(m Member, count int) MemberManifest {
	sha := strings.Repeat("c", 64)
	return MemberManifest{Schema: ManifestSchema, Run: "run1", CheckpointID: "c1", Member: m,
		Object: RecordsObject("run1", "c1", m, sha), SHA256: sha, Count: count, Size: int64(10 * count)}
}

// TestMemberListRoundTrip: PROTOCOL §3, the member list: sorted by
// member whatever the order given, named by its digest, and read back
// only when its bytes are the ones the reference names.
func TestMemberListRoundTrip(t *testing.T) {
	b, ref, err := EncodeMemberList("run1", "c1", nil, []MemberManifest{listManifest("owner.b", 2), listManifest("agent.a", 1)})
	if err != nil {
		t.Fatal(err)
	}
	again, ref2, err := EncodeMemberList("run1", "c1", nil, []MemberManifest{listManifest("agent.a", 1), listManifest("owner.b", 2)})
	if err != nil || !bytes.Equal(b, again) || ref != ref2 {
		t.Fatalf("the list depends on the order given: %v\n%s\n%s", err, b, again)
	}
	if ref.Count != 2 || ref.Size != int64(len(b)) || !strings.HasPrefix(ref.Object, "run1/c1/members.") || !strings.HasSuffix(ref.Object, ".json") {
		t.Fatalf("ref %+v", ref)
	}
	list, err := DecodeMemberList("run1", "c1", ref, b)
	if err != nil {
		t.Fatal(err)
	}
	if got := list.Members; len(got) != 2 || got[0].Member != "agent.a" || got[1].Member != "owner.b" {
		t.Fatalf("decoded %+v", got)
	}
	// Every member that committed is named, those without a manifest too;
	// a manifest of a member that did not commit is refused.
	withAll, ref3, err := EncodeMemberList("run1", "c1", []Member{"sandbox.s1", "owner.b", "agent.a"}, []MemberManifest{listManifest("agent.a", 1)})
	if err != nil {
		t.Fatal(err)
	}
	c := CheckpointManifest{Schema: CheckpointSchema, Run: "run1", CheckpointID: "c1", MemberList: &ref3}
	if err := c.LoadMembers(func(string) ([]byte, error) { return withAll, nil }); err != nil {
		t.Fatal(err)
	}
	if got := c.CommittedMembers(); len(got) != 3 || got[0] != "agent.a" || got[2] != "sandbox.s1" || len(c.Members) != 1 {
		t.Fatalf("committed %v, members %+v", got, c.Members)
	}
	if _, _, err := EncodeMemberList("run1", "c1", []Member{"owner.b"}, []MemberManifest{listManifest("agent.a", 1)}); !errors.Is(err, ErrMismatch) {
		t.Errorf("a manifest of a member that did not commit: %v, want ErrMismatch", err)
	}
	// One byte changed (agent.a's count 1 → 7): refused, the digest named.
	tampered := bytes.Replace(b, []byte(`"count":1`), []byte(`"count":7`), 1)
	if _, err := DecodeMemberList("run1", "c1", ref, tampered); !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "sha256") {
		t.Errorf("tampered list: %v, want ErrMismatch naming the sha256", err)
	}
	// Another checkpoint's reference names another object.
	if _, err := DecodeMemberList("run1", "c2", ref, b); !errors.Is(err, ErrMismatch) {
		t.Errorf("another checkpoint: %v, want ErrMismatch", err)
	}
	if _, _, err := EncodeMemberList("run1", "c1", nil, []MemberManifest{listManifest("agent.a", 1), listManifest("agent.a", 2)}); !errors.Is(err, ErrInvalid) {
		t.Errorf("a member twice: %v, want ErrInvalid", err)
	}
	other := listManifest("agent.a", 1)
	other.CheckpointID, other.Object = "c2", RecordsObject("run1", "c2", "agent.a", other.SHA256)
	if _, _, err := EncodeMemberList("run1", "c1", nil, []MemberManifest{other}); !errors.Is(err, ErrMismatch) {
		t.Errorf("another checkpoint's manifest: %v, want ErrMismatch", err)
	}
}

// TestCheckpointSchemas: schema 1 (inline members) and 2 (a member list)
// are read; a committed schema 2 without its list, and any other schema,
// are refused by name.
func TestCheckpointSchemas(t *testing.T) {
	_, ref, err := EncodeMemberList("run1", "c1", nil, []MemberManifest{listManifest("agent.a", 1)})
	if err != nil {
		t.Fatal(err)
	}
	base := CheckpointManifest{Run: "run1", CheckpointID: "c1", Created: time.Now().UTC()}
	v1 := base
	v1.Schema, v1.Members = CheckpointSchemaInline, []MemberManifest{listManifest("agent.a", 1)}
	v2 := base
	v2.Schema, v2.MemberList = CheckpointSchema, &ref
	marker := base
	marker.Schema, marker.Aborted, marker.Reason = CheckpointSchema, true, "why"
	for name, c := range map[string]CheckpointManifest{"schema 1": v1, "schema 2": v2, "schema 2 abort marker": marker} {
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if s := v1.Stored(); len(s.Members) != 1 {
		t.Errorf("schema 1 stored without its inline members")
	}
	loaded := v2
	loaded.Members = []MemberManifest{listManifest("agent.a", 1)}
	if err := loaded.Validate(); err != nil {
		t.Errorf("schema 2 with its list loaded: %v", err)
	}
	if s := loaded.Stored(); s.Members != nil || s.MemberList == nil {
		t.Errorf("schema 2 stored: %+v", s)
	}
	noList := base
	noList.Schema = CheckpointSchema
	if err := noList.Validate(); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "member_list") {
		t.Errorf("schema 2 without a list: %v", err)
	}
	v3 := v2
	v3.Schema = 3
	if err := v3.Validate(); !errors.Is(err, ErrUnknownVersion) || !strings.Contains(err.Error(), "3, this build reads 1 and 2") {
		t.Errorf("schema 3: %v, want ErrUnknownVersion naming it", err)
	}
}

// TestCheckpointManifestStaysSmall: PROTOCOL-HISTORY §35, at 100,000 members the
// KV checkpoint manifest is a few hundred bytes, far under NATS's 1 MB
// payload; the member list, an object, holds them all and reads back.
func TestCheckpointManifestStaysSmall(t *testing.T) {
	const n = 100_000
	members := make([]MemberManifest, 0, n)
	for i := range n {
		members = append(members, listManifest(Member(fmt.Sprintf("sandbox.s%06d", i)), 1))
	}
	b, ref, err := EncodeMemberList("run1", "c1", nil, members)
	if err != nil {
		t.Fatal(err)
	}
	c := CheckpointManifest{Schema: CheckpointSchema, Run: "run1", CheckpointID: "c1", Created: time.Now().UTC(), CommitSeq: 9,
		MemberList: &ref, Members: members}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	v, err := json.Marshal(c.Stored())
	if err != nil {
		t.Fatal(err)
	}
	if len(v) > 1024 {
		t.Errorf("the KV manifest of %d members is %d bytes", n, len(v))
	}
	got, err := DecodeMemberList("run1", "c1", ref, b)
	if err != nil || len(got.Members) != n {
		t.Fatalf("%d members read back, %v", len(got.Members), err)
	}
	t.Logf("%d members: KV manifest %d bytes, member list %d bytes", n, len(v), len(b))
}
