// Package swekind is the swe kind of task (owner.TaskKind, with setup and
// fork spec): a SWE-bench instance, graded as the SWE-bench harness grades
// it. `stillpoint owner --task-kind swe` serves it; docs/TASKS.md is the
// reference of the payload and the verdict.
//
// # The instance
//
// The payload is a row of a SWE-bench style dataset (Instance):
// instance_id, repo, base_commit, problem_statement, test_patch,
// FAIL_TO_PASS and PASS_TO_PASS (JSON lists, or strings holding them as
// the dataset stores them), and image, the container image whose working
// directory holds the repository at base_commit. test_cmd (default
// DefaultTestCmd) is the command that runs tests; "task" and "prompt"
// (default: problem_statement) are the agent's adapters'. Other keys are
// ignored, so a dataset's row with an image is a payload.
//
// # The session
//
// Spec builds the sandbox sb-<episode> of the instance's image
// (provider.Spec.ImageRef; the owner resolves it and applies its config,
// the working directory among it), with sandboxd as its first process and
// the harness in it. Setup checks that the repository in the working
// directory is at base_commit and records in the session data (Data)
// what the grade needs: the base commit, the test patch, the tests, the
// test command, the working directory and the image, out of the agent's reach.
//
// # The grade
//
// Grade trusts nothing of the session's sandbox, where the agent was
// root, but the model's diff: there it runs git add -A into a copy of
// the index and git diff --binary against the base commit (so the
// model's commits count too), with no replace objects, no system or
// global config, no hooks and no user excludes or attributes file, and
// takes that diff, bounded (MaxDiff). As SWE-bench grades in a fresh
// container, it grades the diff in a fresh sandbox of the instance's
// image (owner.GradeSandboxes, Fresh): it checks that the repository
// there is at the base commit, applies the diff (one that does not apply
// is reward 0), resets the files the test patch touches to the base
// commit and applies the test patch, runs the test command on those files
// (not data files, as SWE-bench), and parses pytest's -rA summary per
// test (ParseLog). The fresh sandbox is removed however the grade ends;
// the session's sandbox is left as the model left it, so a grade
// restored from a checkpoint taken in its middle grades again from the
// start.
//
// The named tests are split as SWE-bench's test_passed and test_failed
// split them: PASSED or XFAIL is a success; FAILED, ERROR, or absent from
// the log is a failure; another status (XPASS) is neither. The instance
// is resolved, reward 1, when no FAIL_TO_PASS and no PASS_TO_PASS test
// failed. The Verdict carries the model's diff and the tests' outcomes as
// SWE-bench's report does.
package swekind
