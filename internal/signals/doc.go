// Package signals is how every command of the project handles the
// process's signals, the way a main is written in this house: the first
// SIGINT or SIGTERM cancels the command's context, and what a second one
// does is the command's choice.
//
// Notify starts it and returns the context and a Handler. The context's
// cause (context.Cause) is ErrSignal, naming the signal; its Err is
// context.Canceled as for any cancel. Each SIGINT or SIGTERM after the
// first calls the again function the command gave: nil ignores it (a
// harness, which its supervisor's stop reaches twice, by its process
// group and by its tree), Die lets it end the process as it would one
// that did not catch it, and the stillpoint CLI prints a line and exits
// 130.
//
// A command that stops in a way of its own takes SIGTERM for a while with
// Handler.OnTerm (the collector checkpoints with stop); SIGINT still
// cancels. On calls a function for every arrival of another signal (the
// collector's SIGUSR1 takes a checkpoint). Whoever starts handling stops it:
// Handler.Stop and the function On returns end their goroutine and wait
// for it.
package signals
