// Command stillpoint runs Stillpoint's parts: the embedded NATS server, and
// the subcommands later capabilities add. See `stillpoint --help`.
package main

import (
	"os"

	"github.com/stillpoint/stillpoint/cmd/stillpoint/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
