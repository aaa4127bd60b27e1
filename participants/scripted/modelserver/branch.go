package modelserver

import (
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// This file is the script's branches (PROTOCOL §5, Branch): a request a
// branch sends carries its label in sandboxapi.BranchHeader ("b<k>", from
// the model relay) and its seed in SeedHeader; a turn may say what each
// branch answers instead (Turn.Branches), so that the branches of one
// rollout diverge.

// BranchPlaceholder is replaced, in a turn's content and tool-call
// arguments, by the label of the branch the request came from ("" for
// none).
const BranchPlaceholder = "{{branch}}"

// AnyBranch is the Turn.Branches key of the turn every branch without its
// own entry answers.
const AnyBranch = "*"

// branchKey is what a Turn.Branches key may be: a label or AnyBranch.
var branchKey = regexp.MustCompile(`^(b[1-9][0-9]{0,8}|\*)$`)

// requestBranch returns a request's branch label and seed (its headers;
// "" and 0 for a request of no branch, or a seed that is no number).
func requestBranch(r *http.Request) (string, uint64) {
	label := r.Header.Get(sandboxapi.BranchHeader)
	seed, _ := strconv.ParseUint(r.Header.Get(sandboxapi.SeedHeader), 10, 64)
	return label, seed
}

// ForBranch returns the turn a request of branch label answers with t
// scripted: t.Branches[label], else t.Branches[AnyBranch], else t, for a
// branch; t for no branch (label ""); with BranchPlaceholder replaced by
// label in its content and its tool calls' arguments, and no Branches.
func (t Turn) ForBranch(label string) Turn {
	if label != "" {
		if b, ok := t.Branches[label]; ok {
			t = b
		} else if b, ok := t.Branches[AnyBranch]; ok {
			t = b
		}
	}
	t.Branches = nil
	t.Content = strings.ReplaceAll(t.Content, BranchPlaceholder, label)
	if len(t.ToolCalls) > 0 {
		t.ToolCalls = slices.Clone(t.ToolCalls)
		for i := range t.ToolCalls {
			tc := &t.ToolCalls[i]
			tc.Function.Arguments = strings.ReplaceAll(tc.Function.Arguments, BranchPlaceholder, label)
		}
	}
	return t
}

// checkBranches checks a turn's branch entries: each key a label or
// AnyBranch, no entry with branches of its own.
func checkBranches(t Turn, field string) error {
	for k, b := range t.Branches {
		if !branchKey.MatchString(k) {
			return fmt.Errorf("%s.branches: key %q is neither b<k> (k from 1) nor %q", field, k, AnyBranch)
		}
		if len(b.Branches) > 0 {
			return fmt.Errorf("%s.branches[%q]: a branch's turn has no branches of its own", field, k)
		}
	}
	return nil
}
