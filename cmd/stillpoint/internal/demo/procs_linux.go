package demo

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/stillpoint/stillpoint/internal/procfs"
)

// runProcesses returns, from the process table, the processes of run
// still alive: every process whose command line says --run <run> (the
// bridge, owner, agents and sandbox daemons), and what the daemons
// launched. Each is "<pid> <command line>".
func runProcesses(run string) ([]string, error) {
	pids, err := procfs.PIDs()
	if err != nil {
		return nil, err
	}
	var out []string
	seen := map[int]bool{}
	for _, pid := range pids {
		argv := cmdline(pid)
		if !hasRun(argv, run) {
			continue
		}
		tree, _ := procfs.Tree(pid)
		for _, p := range tree {
			if !seen[p] {
				seen[p] = true
				out = append(out, fmt.Sprintf("%d %s", p, strings.Join(cmdline(p), " ")))
			}
		}
	}
	return out, nil
}

// sandboxProcesses returns the sandbox daemons of run (sandboxd member
// --run <run> --id ...) and the processes they launched (their children:
// the harnesses, not what those run in turn).
func sandboxProcesses(run string) (daemons, launched []int, err error) {
	pids, err := procfs.PIDs()
	if err != nil {
		return nil, nil, err
	}
	for _, pid := range pids {
		argv := cmdline(pid)
		if len(argv) < 2 || argv[1] != "member" || !hasRun(argv, run) || !slices.Contains(argv, "--id") {
			continue
		}
		daemons = append(daemons, pid)
		if kids, _, err := procfs.Children(pid, 0, nil, nil); err == nil {
			launched = append(launched, kids...)
		}
	}
	return daemons, launched, nil
}

// hasRun reports whether argv has --run run.
func hasRun(argv []string, run string) bool {
	for i := 0; i+1 < len(argv); i++ {
		if argv[i] == "--run" && argv[i+1] == run {
			return true
		}
	}
	return false
}

// cmdline returns the arguments of pid (none once it is gone).
func cmdline(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
}

// killPID sends SIGKILL to pid.
func killPID(pid int) error {
	return syscall.Kill(pid, syscall.SIGKILL)
}
