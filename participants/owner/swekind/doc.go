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
// test command and the working directory, out of the agent's reach.
//
// # The grade
//
// Grade keeps the model's changes (git add -A, then git diff --binary
// against the base commit, so its commits count too), resets the work
// tree to the base commit (checkout -f; clean -fd, which keeps ignored
// files: an image's build products such as compiled extensions and egg
// metadata are ignored ones), applies the model's patch, resets the files
// the test patch touches to the base commit and applies the test patch,
// runs the test command on those files (not data files, as SWE-bench),
// and parses pytest's -rA summary per test (ParseLog). The instance is
// resolved, reward 1, when every FAIL_TO_PASS and every PASS_TO_PASS test
// passed (PASSED or XFAIL). The Verdict carries the model's patch and the
// tests' outcomes as SWE-bench's report does. At the end the work tree
// holds the model's changes again; while a grade is under way they are
// kept in the git directory, so a grade restored from a checkpoint taken
// in its middle grades the same patch.
package swekind
