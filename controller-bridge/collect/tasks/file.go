package tasks

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

// Write writes ts as a tasks file (JSONL, one modelserver.TaskLine per
// task): what `stillpoint collect --tasks` reads, each line with the
// turns script gives its task beside the payload, for `stillpoint
// modelserver --tasks`.
func Write(w io.Writer, ts []collect.Task, script modelserver.Script) error {
	for _, t := range ts {
		l := modelserver.TaskLine{RolloutID: t.RolloutID, Task: t.Task}
		turns, ok := script[l.ScriptName()]
		if !ok {
			return fmt.Errorf("tasks: no model turns for %s (script %q)", t.RolloutID, l.ScriptName())
		}
		l.Model = &modelserver.TaskModel{Turns: turns}
		b, err := json.Marshal(l)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "%s\n", b); err != nil {
			return err
		}
	}
	return nil
}
