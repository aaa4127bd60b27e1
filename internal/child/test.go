package child

// TB is what StartForTest needs of a test: testing.TB has it. (So that
// this package, which the demo uses, does not import package testing.)
type TB interface {
	Helper()
	Cleanup(func())
	Failed() bool
	Logf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// dumpTail is how much of a process's output a failed test's log gets:
// the end, where the failure is.
const dumpTail = 32 << 10

// StartForTest starts the process of spec for the test t, failing it if
// the process cannot start. The test's cleanup stops the process (Stop:
// its stop signal, its grace, then SIGKILL to its group; whatever is left
// of its group is killed and it is reaped) and, if the test failed, writes
// the end of its output to the test's log.
func StartForTest(t TB, spec Spec) *Process {
	t.Helper()
	p, err := Start(spec)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		exit := p.Stop()
		if t.Failed() {
			out := p.Output()
			if len(out) > dumpTail {
				out = "...\n" + out[len(out)-dumpTail:]
			}
			t.Logf("--- %s (pid %d, %s) output:\n%s", p.Name(), p.Pid(), exit, out)
		}
	})
	return p
}
