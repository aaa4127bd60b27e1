// Package leak checks that a package's tests leave no goroutine behind, on
// any machine: goleak (go.uber.org/goleak), waited for with a bound that
// holds when the machine is loaded.
//
// Every package whose tests start goroutines, directly or through what
// they run (a NATS connection, a server, a child process), has
//
//	func TestMain(m *testing.M) { leak.VerifyTestMain(m) }
//
// (packages that use JetStream pass jstest.LeakOptions()).
//
// Why a bound of its own: a goroutine on its way out, such as the read
// loop of a connection just closed, is only gone once the scheduler ran
// it. goleak looks again for about 0.4 s and then reports it; on two cores
// busy with other tests, -race and other work, that is not always long
// enough. Find looks again for up to Settle instead. A goroutine that
// leaks never ends, so the longer bound only delays the report of a real
// leak; it never hides one.
//
// IgnoreBlockedForever is the one kind of ignore the package offers, for a
// goroutine of a library that blocks on a nil channel: nothing can ever
// wake it, so no close or cancel of ours can end it, and it holds no
// resource but its stack and what it refers to. The ignore is narrow: the
// same function blocked on anything else is still a leak.
package leak
