package main

import (
	"os"

	"github.com/stillpoint/stillpoint/cmd/sandboxd/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
