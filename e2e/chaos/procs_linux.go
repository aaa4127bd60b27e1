package chaos

import (
	"slices"
	"syscall"

	"github.com/stillpoint/stillpoint/cmd/stillpoint/demo"
	"github.com/stillpoint/stillpoint/internal/procfs"
)

// sandboxProcesses returns the sandbox daemons of run (sandboxd member
// --run <run> --id ...) and the processes they launched (their children:
// the harnesses, not what those run in turn).
func sandboxProcesses(run string) (daemons, launched []int, err error) {
	pids, err := procfs.PIDs()
	if err != nil {
		return nil, nil, err
	}
	for _, pid := range pids {
		argv := demo.Cmdline(pid)
		if len(argv) < 2 || argv[1] != "member" || !demo.HasRun(argv, run) || !slices.Contains(argv, "--id") {
			continue
		}
		daemons = append(daemons, pid)
		if kids, _, err := procfs.Children(pid, 0, nil, nil); err == nil {
			launched = append(launched, kids...)
		}
	}
	return daemons, launched, nil
}

// killPID sends SIGKILL to pid.
func killPID(pid int) error {
	return syscall.Kill(pid, syscall.SIGKILL)
}
