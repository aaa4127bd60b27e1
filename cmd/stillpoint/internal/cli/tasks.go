package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/controller-bridge/collect/tasks"
	"github.com/stillpoint/stillpoint/controller-bridge/collect/tasks/sweimage"
	"github.com/stillpoint/stillpoint/internal/atomicfile"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

type tasksFlags struct {
	set           string
	out           string
	dir           string
	n             int
	toolSeconds   float64
	verifySeconds float64
	harness       string
	cache         string
}

func newTasksCmd(g *globals) *cobra.Command {
	var f tasksFlags
	cmd := &cobra.Command{
		Use:   "tasks",
		Short: "Write a bundled task set as a tasks file, with the scripted model's turns",
		Long: `Write one of the bundled task sets as a tasks file (JSONL) that collect reads,
each line with the scripted model's turns for its task beside the payload
("model": {"turns": [...]}), which modelserver --tasks serves. docs/TASKS.md
describes the format.

  repos     small repositories with a failing test each (Python's unittest,
            shell, Go), written into --dir with absolute paths in the file;
            tasks of the command kind: owner --task-kind command. The script
            applies each known fix; the control task's fixes nothing.
            --harness says whose tools the script calls: the scripted
            harness's (bash), OpenCode's (read, edit, write, bash: for
            agent --adapter opencode), Claude Code's (Read, Edit, Write,
            Bash: for agent --adapter claude) or Codex's (exec_command: for
            agent --adapter codex).
  swe       the SWE-style set: small Python libraries with an issue each, as
            SWE-bench instances (owner --task-kind swe), each with its image:
            one OCI layout in --dir/oci ("image": "<dir>/oci:<instance id>"),
            built from a Debian base that debootstrap makes once in --cache
            (a minute or two the first time). The script reads the code,
            reproduces the bug and runs the tests, and applies the known
            fix; --harness as for repos.
  scripted  the scripted coding tasks of the demo: owner --task-kind scripted.`,
		Example: `  stillpoint tasks --set repos --out tasks.jsonl --dir repos
  stillpoint tasks --set repos --harness opencode --n 4 --out tasks.jsonl --dir repos
  stillpoint tasks --set swe --harness opencode --out tasks.jsonl --dir swe
  stillpoint tasks --set scripted --n 32 --out tasks.jsonl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runTasks(cmd.Context(), g, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.set, "set", "repos", "the set: repos, swe or scripted")
	fl.StringVar(&f.out, "out", "tasks.jsonl", "the tasks file to write")
	fl.StringVar(&f.dir, "dir", "", "repos, swe: where the repositories (and swe's images) go (default: repos or swe beside --out)")
	fl.IntVar(&f.n, "n", 0, "how many tasks: scripted, default 8; repos and swe, the first n of the set in order of their ids (default all)")
	fl.Float64Var(&f.toolSeconds, "tool-seconds", 0, "how long the slow tool call of each task takes (0: the set's default)")
	fl.Float64Var(&f.verifySeconds, "verify-seconds", 0, "repos: how long each verify sleeps before it runs the tests")
	fl.StringVar(&f.harness, "harness", tasks.HarnessScripted, "repos, swe: the harness whose tools the model's script calls: scripted, opencode, claude or codex")
	fl.StringVar(&f.cache, "cache", sweimage.DefaultCache, "swe: where the images' Debian base is built once and kept")
	return cmd
}

func runTasks(ctx context.Context, g *globals, f tasksFlags) error {
	out, err := filepath.Abs(f.out)
	if err != nil {
		return &exitError{code: ExitUsage, err: err}
	}
	var (
		ts     []collect.Task
		script modelserver.Script
		where  string
	)
	switch f.set {
	case "repos", "swe":
		if !slices.Contains(tasks.Harnesses, f.harness) {
			return &exitError{code: ExitUsage, err: fmt.Errorf("--harness %q: want one of %s", f.harness, strings.Join(tasks.Harnesses, ", "))}
		}
		dir := f.dir
		if dir == "" {
			dir = filepath.Join(filepath.Dir(out), f.set)
		}
		if dir, err = filepath.Abs(dir); err != nil {
			return &exitError{code: ExitUsage, err: err}
		}
		if f.n < 0 {
			return &exitError{code: ExitUsage, err: fmt.Errorf("--n %d: want at least 1 (or 0: the whole set)", f.n)}
		}
		if f.set == "repos" {
			ts, script, err = tasks.Repos(tasks.RepoOptions{Dir: dir, ToolSeconds: f.toolSeconds, VerifySeconds: f.verifySeconds, Harness: f.harness})
			where = fmt.Sprintf(", their repositories in %s; serve them with owner --task-kind command", dir)
		} else {
			ts, script, err = tasks.SWE(ctx, tasks.SWEOptions{Dir: dir, Cache: f.cache, ToolSeconds: f.toolSeconds, Harness: f.harness, Progress: g.stderr})
			where = fmt.Sprintf(", their images in %s; serve them with owner --task-kind swe", filepath.Join(dir, "oci"))
		}
		if err != nil {
			return err
		}
		if f.n > 0 && f.n < len(ts) {
			for _, t := range ts[f.n:] {
				delete(script, t.RolloutID)
			}
			ts = ts[:f.n]
		}
	case "scripted":
		if f.n == 0 {
			f.n = 8
		}
		if f.n < 1 {
			return &exitError{code: ExitUsage, err: fmt.Errorf("--n %d: want at least 1", f.n)}
		}
		ts, script = tasks.Set(tasks.Options{N: f.n, ToolSeconds: f.toolSeconds})
		where = "; serve them with owner --task-kind scripted"
	default:
		return &exitError{code: ExitUsage, err: fmt.Errorf("--set %q: want repos, swe or scripted", f.set)}
	}
	var buf bytes.Buffer
	if err := tasks.Write(&buf, ts, script); err != nil {
		return err
	}
	if err := atomicfile.Write(out, buf.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(g.stdout, "stillpoint: wrote %d %s tasks to %s%s\n", len(ts), f.set, out, where)
	return nil
}

type modelServerFlags struct {
	tasks  string
	listen string
	ledger string
}

func newModelServerCmd(g *globals) *cobra.Command {
	var f modelServerFlags
	cmd := &cobra.Command{
		Use:   "modelserver",
		Short: "Serve the scripted model of a tasks file (OpenAI-compatible chat completions)",
		Long: `Serve the scripted model: POST /v1/chat/completions answers each request with
the next turn of its task's script (the request names the task with the
X-Stillpoint-Task header, as the scripted harness sends it), read from the
"model" turns of the tasks file's lines; GET /ledger lists every request, the
proof that no call was repeated and no turn injected. With --ledger the ledger
is also written to a file when the server stops.

For real runs any OpenAI-compatible server (vLLM, say) takes its place: give
the agents its URL as --model-url.`,
		Example: `  stillpoint modelserver --tasks tasks.jsonl --listen 127.0.0.1:8000 --ledger ledger.json`,
		Args:    cobra.NoArgs,
		RunE:    func(cmd *cobra.Command, _ []string) error { return runModelServer(cmd.Context(), g, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.tasks, "tasks", "", "tasks file whose lines carry model turns (required)")
	fl.StringVar(&f.listen, "listen", "127.0.0.1:8000", "HTTP address (port 0: random)")
	fl.StringVar(&f.ledger, "ledger", "", "write the ledger (JSON) to this file when the server stops")
	return cmd
}

func runModelServer(ctx context.Context, g *globals, f modelServerFlags) error {
	if f.tasks == "" {
		return &exitError{code: ExitUsage, err: errors.New("--tasks is required")}
	}
	script, err := modelserver.LoadTasksFile(f.tasks)
	if err != nil {
		return &exitError{code: ExitUsage, err: err}
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return err
	}
	ms := modelserver.New(script)
	srv := &http.Server{Handler: ms, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(g.stdout, "stillpoint: scripted model of %d tasks on http://%s\n", len(script), ln.Addr())
	select {
	case <-ctx.Done():
	case err = <-served:
		return err
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-served
	if f.ledger != "" {
		b, err := json.MarshalIndent(ms.Ledger(), "", "  ")
		if err != nil {
			return err
		}
		if err := atomicfile.Write(f.ledger, append(b, '\n'), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(g.stdout, "stillpoint: ledger of %d requests written to %s\n", len(ms.Ledger()), f.ledger)
	}
	return nil
}
