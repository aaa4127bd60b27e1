package driver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
)

// output runs an OpenCode command in the session folder and returns its
// standard output; its standard error goes to stderr.
func (c Config) output(ctx context.Context, stderr io.Writer, args ...string) ([]byte, error) {
	cmd := c.command(ctx, nil, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("opencode %s: %s", args[0], exitText(err))
	}
	return out.Bytes(), nil
}

// findSession returns the session of the folder: c.Session, else the id
// run recorded, else the newest session of the listing titled c.Title
// (run records the id only once the first event came), else "".
func (c Config) findSession(ctx context.Context, stderr io.Writer) (string, error) {
	if c.Session != "" {
		return c.Session, nil
	}
	if id := c.savedSessionID(); id != "" {
		return id, nil
	}
	out, err := c.output(ctx, stderr, "session", "list", "--format", "json")
	if err != nil {
		return "", err
	}
	var list []SessionInfo
	if len(bytes.TrimSpace(out)) > 0 {
		if err := json.Unmarshal(out, &list); err != nil {
			return "", fmt.Errorf("the session list does not decode: %w", err)
		}
	}
	list = slices.DeleteFunc(list, func(s SessionInfo) bool { return c.Title != "" && s.Title != c.Title })
	if len(list) == 0 {
		return "", nil
	}
	newest := slices.MaxFunc(list, func(a, b SessionInfo) int { return int(a.Updated - b.Updated) })
	return newest.ID, nil
}

// export returns the saved session id (`opencode export <id>`).
func (c Config) export(ctx context.Context, stderr io.Writer, id string) (Export, error) {
	out, err := c.output(ctx, stderr, "export", id)
	if err != nil {
		return Export{}, err
	}
	var e Export
	if err := json.Unmarshal(out, &e); err != nil {
		return Export{}, fmt.Errorf("the export of %s does not decode: %w", id, err)
	}
	return e, nil
}

// Check is the resume decision, read from the saved session in the folder
// (Decide): the session is found (findSession) and exported. A folder
// with no session, one whose sessions do not list, or one whose session
// does not export, is a decision to start over (a store the crash left
// unreadable holds nothing to continue); the error is for a check that
// could not run.
func Check(ctx context.Context, c Config, stderr io.Writer) (Decision, error) {
	if err := c.Validate(false); err != nil {
		return Decision{}, err
	}
	if err := c.prepare(); err != nil {
		return Decision{}, err
	}
	id, err := c.findSession(ctx, stderr)
	if ctx.Err() != nil {
		return Decision{}, context.Cause(ctx)
	}
	if err != nil {
		return Decision{Reason: "the saved sessions do not list: " + err.Error()}, nil
	}
	if id == "" {
		return Decision{Reason: "no saved session"}, nil
	}
	e, err := c.export(ctx, stderr, id)
	if ctx.Err() != nil {
		return Decision{}, context.Cause(ctx)
	}
	if err != nil {
		return Decision{Session: id, Reason: "the saved session does not export: " + err.Error()}, nil
	}
	if e.Info.ID == "" {
		e.Info.ID = id
	}
	return Decide(e, c.Prompt, c.Workdir), nil
}
