// Package cli is the stillpoint command line: the root command with its
// global NATS and logging flags, and one file per subcommand. Subcommands
// parse flags into a component's Config and call its Run(ctx); they hold no
// logic of their own. `stillpoint owner --task-kind` picks its kind from
// taskkinds.go. The demo is package demo, registered in root.go; it and
// `stillpoint tasks` (tasks.go, with `stillpoint modelserver`, which serves
// a tasks file's model turns) are the commands that use the bundled task
// sets of controller-bridge/collect/tasks.
package cli
