package bridgeapi_test

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
)

func TestBranchRequestValidate(t *testing.T) {
	ok := bridgeapi.BranchRequest{Rollouts: []string{"r1"}, N: 2}
	if err := ok.Validate(); err != nil {
		t.Fatalf("%+v: %v", ok, err)
	}
	for _, c := range []struct {
		req  bridgeapi.BranchRequest
		says string
	}{
		{bridgeapi.BranchRequest{N: 1}, "rollouts:"},
		{bridgeapi.BranchRequest{Rollouts: []string{"r1"}}, "n: 0"},
		{bridgeapi.BranchRequest{Rollouts: []string{"r1", "r1"}, N: 1}, "appears twice"},
		{bridgeapi.BranchRequest{Rollouts: []string{"../x"}, N: 1}, "rollouts[0]"},
		{bridgeapi.BranchRequest{Rollouts: []string{"r1", "r2"}, N: events.MaxBranches/2 + 1}, "over the limit"},
		{bridgeapi.BranchRequest{Rollouts: []string{"r1"}, N: 1, First: -1}, "first:"},
		{bridgeapi.BranchRequest{Rollouts: []string{"r1"}, N: 1, ID: "a/b"}, "branch_id"},
		{bridgeapi.BranchRequest{Rollouts: []string{"r1"}, N: 1, Source: "a b"}, "source_checkpoint_id"},
		{bridgeapi.BranchRequest{Rollouts: []string{"r1"}, N: 1, TimeoutMS: -1}, "timeout_ms"},
	} {
		err := c.req.Validate()
		if !errors.Is(err, bridgeapi.ErrBadRequest) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%+v: %v, want ErrBadRequest saying %q", c.req, err, c.says)
		}
	}
}

func TestBranchSeed(t *testing.T) {
	in := binary.BigEndian.AppendUint64(nil, 42)
	in = append(in, "r1"...)
	in = binary.BigEndian.AppendUint64(in, 3)
	sum := sha256.Sum256(in)
	if got, want := bridgeapi.BranchSeed(42, "r1", 3), binary.BigEndian.Uint64(sum[:8])&math.MaxInt64; got != want {
		t.Fatalf("BranchSeed(42, r1, 3) = %d, want %d", got, want)
	}
	// Model servers take a seed as an int64 (vLLM refuses a larger one).
	for k := 1; k <= 1000; k++ {
		if s := bridgeapi.BranchSeed(7, "t0-r0", k); s > math.MaxInt64 {
			t.Fatalf("BranchSeed(7, t0-r0, %d) = %d, over the int64 range", k, s)
		}
	}
	if bridgeapi.BranchSeed(1, "r1", 11) == bridgeapi.BranchSeed(1, "r11", 1) {
		t.Fatal("r1 branch 11 and r11 branch 1 share a seed")
	}
}
