package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/stillpoint/stillpoint/internal/signals"
	"github.com/stillpoint/stillpoint/participants/scripted/harness"
)

func main() {
	var cfg harness.Config
	flag.StringVar(&cfg.ModelURL, "model-url", os.Getenv("STILLPOINT_MODEL_URL"), "chat-completions server base URL")
	flag.StringVar(&cfg.Model, "model", "scripted", "model name")
	flag.StringVar(&cfg.Task, "task", "", "task id")
	flag.StringVar(&cfg.Episode, "episode", os.Getenv("STILLPOINT_EPISODE"), "episode sent with each model call")
	flag.StringVar(&cfg.Prompt, "prompt", "", "user message of a new session")
	flag.StringVar(&cfg.DataDir, "data", ".harness", "session folder")
	flag.StringVar(&cfg.WorkDir, "work", ".", "where tool commands run")
	flag.BoolVar(&cfg.Continue, "continue", false, "continue the saved session without a user message")
	check := flag.Bool("check", false, "print whether the saved session can be continued (JSON) and exit")
	flag.Parse()
	if *check {
		b, _ := json.Marshal(harness.Check(cfg.DataDir, cfg.Task))
		fmt.Println(string(b))
		return
	}
	cfg.Out = os.Stdout
	// SIGINT or SIGTERM stops the harness; a second one (its supervisor's
	// stop reaches it by its group and by its tree) changes nothing.
	ctx, sigs := signals.Notify(context.Background(), nil)
	defer sigs.Stop()
	if err := harness.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "scripted-harness:", err)
		os.Exit(1)
	}
}
