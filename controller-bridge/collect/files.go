package collect

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// openFiles opens the output and the dispatch log for appending, reads
// what earlier runs wrote, and cuts a line a crash left half-written.
func (c *Collector) openFiles() (map[string]dispatchEntry, error) {
	for _, p := range []string{c.cfg.Output, c.cfg.DispatchLog} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
	}
	var err error
	if c.out, err = openLog(c.cfg.Output); err != nil {
		return nil, err
	}
	if err := readLines(c.out, func(line []byte) error {
		var r Result
		if err := json.Unmarshal(line, &r); err != nil || r.RolloutID == "" {
			return fmt.Errorf("%s: a line that is not a result: %.80q", c.cfg.Output, line)
		}
		if _, dup := c.done[r.RolloutID]; dup {
			return fmt.Errorf("%s: rollout %s has two results", c.cfg.Output, r.RolloutID)
		}
		c.done[r.RolloutID] = r
		return nil
	}); err != nil {
		return nil, err
	}
	if c.dlog, err = openLog(c.cfg.DispatchLog); err != nil {
		return nil, err
	}
	prior := map[string]dispatchEntry{}
	if err := readLines(c.dlog, func(line []byte) error {
		var e dispatchEntry
		if err := json.Unmarshal(line, &e); err != nil || e.RolloutID == "" {
			return fmt.Errorf("%s: a line that is not a dispatch: %.80q", c.cfg.DispatchLog, line)
		}
		prior[e.RolloutID] = e // the last dispatch is the one that counts
		return nil
	}); err != nil {
		return nil, err
	}
	return prior, nil
}

func openLog(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// readLines calls fn for every complete line of f, truncates a last line
// without its newline (a write a crash cut), and leaves f at its end.
func readLines(f *os.File, fn func([]byte) error) error {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	r := bufio.NewReaderSize(f, 1<<16)
	var good int64
	for {
		line, err := r.ReadBytes('\n')
		if err == io.EOF {
			if len(line) > 0 {
				if terr := f.Truncate(good); terr != nil {
					return terr
				}
			}
			break
		}
		if err != nil {
			return err
		}
		good += int64(len(line))
		if t := bytes.TrimSpace(line); len(t) > 0 {
			if err := fn(t); err != nil {
				return err
			}
		}
	}
	_, err := f.Seek(good, io.SeekStart)
	return err
}

// appendLine writes v as one JSON line and syncs it.
func appendLine(f *os.File, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		return err
	}
	return f.Sync()
}
