// Package procfs reads what the project needs from /proc: a process's stat
// line, its threads and children, its pending signals, its environment, the
// list of processes, its cgroup v2 path, its pid in every PID namespace,
// and this process's mount table.
//
// # Reading without allocating
//
// sandboxd re-reads stat files in tight loops while it stops a tree, so the
// readers take a buffer and return it (grown when a file did not fit) for
// the next call:
//
//	buf := make([]byte, 4096)
//	st, buf, err := procfs.ReadStat(pid, buf)
//
// A caller that reads one file now and then passes nil. A held stat file
// (OpenStat, ReadStatFD) is cheaper still: a pread instead of open, read
// and close, and it fails rather than read a process that reused the pid.
//
// # Processes that go away
//
// Any process may exit between two reads. A file whose process (or
// thread) no longer exists is ErrGone, so that callers can tell "gone"
// from a real failure with errors.Is. The boolean helpers (SignalPending,
// VforkWait, EnvironHas) report false for a process that is gone.
//
// # Finding a tree
//
// Children reads /proc/<pid>/task/<tid>/children, which lists the children
// forked by one thread; a process's children are the union over its
// threads. A tree is found by reading that for each process, level by
// level, never by scanning all of /proc (PIDs is there for the last
// resort).
//
// ParseStat and ParsePIDs are pure and build everywhere; the readers are
// Linux-only and return errors.ErrUnsupported elsewhere.
package procfs
