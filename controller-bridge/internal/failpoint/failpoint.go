package failpoint

import (
	"os"
	"strings"
	"syscall"
)

// Env is the environment variable that lists the armed points.
const Env = "STILLPOINT_FAILPOINTS"

// Hit kills the process if name is armed. It never returns then.
func Hit(name string) {
	armed := os.Getenv(Env)
	if armed == "" {
		return
	}
	for _, p := range strings.Split(armed, ",") {
		if strings.TrimSpace(p) == name {
			os.Stderr.WriteString("failpoint: " + name + ": killing the process\n")
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
}
