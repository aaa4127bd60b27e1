package demo

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/stillpoint/stillpoint/internal/procfs"
)

// RunProcesses returns, from the process table, the processes of run
// still alive: every process whose command line says --run <run> (the
// bridge, owner, agents and sandbox daemons), and what the daemons
// launched. Each is "<pid> <command line>".
func RunProcesses(run string) ([]string, error) {
	pids, err := procfs.PIDs()
	if err != nil {
		return nil, err
	}
	var out []string
	seen := map[int]bool{}
	for _, pid := range pids {
		argv := Cmdline(pid)
		if !HasRun(argv, run) {
			continue
		}
		tree, _ := procfs.Tree(pid)
		for _, p := range tree {
			if !seen[p] {
				seen[p] = true
				out = append(out, fmt.Sprintf("%d %s", p, strings.Join(Cmdline(p), " ")))
			}
		}
	}
	return out, nil
}

// HasRun reports whether argv has --run run.
func HasRun(argv []string, run string) bool {
	for i := 0; i+1 < len(argv); i++ {
		if argv[i] == "--run" && argv[i+1] == run {
			return true
		}
	}
	return false
}

// Cmdline returns the arguments of pid (none once it is gone).
func Cmdline(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
}
