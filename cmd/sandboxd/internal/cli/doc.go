// Package cli is the command line of sandboxd:
//
//   - `sandboxd member --state DIR --run RUN --id SANDBOX` is the daemon on
//     the bus (package sandboxd/daemon): member sandbox.<SANDBOX> of RUN,
//     which pauses its launches at every checkpoint and serves the agent;
//   - `sandboxd run --state DIR -- cmd args...` launches a command under
//     the supervisor of package sandboxd, to be paused and continued by
//     hand: SIGUSR1 pauses it, SIGUSR2 continues it, SIGINT or SIGTERM
//     stops it (a second one kills it at once). Each event is printed as a
//     JSON line on stdout; the exit status is the launch's (128+n when
//     signal n killed it);
//   - `sandboxd modes` prints the pause modes the host allows, `sandboxd
//     version` the build.
//
// It uses the standard library's flag package only, so the binary stays
// small and static (CGO_ENABLED=0).
package cli
