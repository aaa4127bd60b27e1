// Package poll waits for a condition by looking at it again and again until
// it holds or a deadline passes: the one way the project polls, in
// production code and in tests alike.
//
// Until is the production form. It takes a context, whose end (a deadline,
// a cancel) is the deadline, and an Interval between two looks: Every for a
// fixed one, Backoff for one that starts short and doubles up to a bound (a
// condition that usually holds at once is seen at once, one that takes long
// is not looked at in a busy loop). The condition returns (true, nil) when
// it holds, and an error to stop at once:
//
//	ctx, cancel := context.WithTimeoutCause(ctx, timeout, os.ErrDeadlineExceeded)
//	defer cancel()
//	err := poll.Until(ctx, poll.Backoff(100*time.Microsecond, 20*time.Millisecond), func() (bool, error) {
//		return isUnmounted(dir)
//	})
//
// UntilWoken is Until for a condition whose changes are announced on a
// channel (a Notify, a freed slot): it looks again at once on a wake-up, and
// every interval in case a change went unannounced.
//
// Wait is the test form: it fails the test, naming what it waited for, if
// the condition does not hold within the time given.
//
//	poll.Wait(t, 10*time.Second, "every member to reopen admission", func() bool { return allOpen(hs) })
//
// Holds is the opposite check: that something stays as it is for a while,
// looked at every 20 ms.
//
// A deadline bounds how long a test waits for something that should happen,
// not how long it takes: pass one that is long against the normal time (the
// tests run with -race, beside other packages' tests and other work, on two
// cores), so that only something that does not happen fails.
//
// Until and Wait look one last time when the deadline passes, so that a condition
// that comes true while the last interval runs out still counts. Neither
// starts a goroutine. The package imports neither package testing nor
// anything of NATS: tests of every package and production code can use it.
package poll
