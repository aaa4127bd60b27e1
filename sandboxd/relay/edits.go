package relay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// This file is the relay's edits: a harness that must add something to a
// request when it continues a saved session (a text block, an empty user
// turn) names, at its launch, the edits that take exactly that addition
// out before the model sees it (sandboxapi.LaunchRequest.RelayEdits). The
// relay applies them to every request of the launch, in the order named,
// before anything else looks at the body: the digest, the body sent
// upstream (and sent again, byte for byte, after a cut) and the capture's
// request are all of the edited body, and the capture record lists what
// each edit removed (trajectory.Call.Edits).

// Edit is one named edit of a launch's requests. Apply takes the request's
// path (with its query) and body and returns the body to forward and the
// parts it removed, each as JSON; an edit that finds nothing to remove
// returns the body unchanged and no parts. An error leaves the body as it
// was (the request is forwarded unedited and the record says why).
// Apply must remove only the exact addition it knows, and must be safe to
// call from several goroutines at once.
type Edit struct {
	Name  string
	Apply func(path string, body []byte) (out []byte, removed []json.RawMessage, err error)
}

var (
	editsMu  sync.RWMutex
	editsReg = map[string]Edit{}
)

// Register adds e to the edits a launch may name. It panics on an empty
// name, a nil Apply or a name registered already: edits are registered
// once, by the init of the file that defines them.
func Register(e Edit) {
	if e.Name == "" || e.Apply == nil {
		panic("relay: Register: an edit needs a name and an Apply")
	}
	editsMu.Lock()
	defer editsMu.Unlock()
	if _, ok := editsReg[e.Name]; ok {
		panic("relay: Register: edit " + e.Name + " registered twice")
	}
	editsReg[e.Name] = e
}

// EditNames returns the names of the registered edits, sorted.
func EditNames() []string {
	editsMu.RLock()
	defer editsMu.RUnlock()
	out := make([]string, 0, len(editsReg))
	for n := range editsReg {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// LookupEdits returns the edits names names, in order, or an error naming
// every unknown one and the known ones. A name given twice is applied
// once.
func LookupEdits(names []string) ([]Edit, error) {
	editsMu.RLock()
	defer editsMu.RUnlock()
	var out []Edit
	var unknown []string
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			continue
		}
		seen[n] = true
		e, ok := editsReg[n]
		if !ok {
			unknown = append(unknown, fmt.Sprintf("%q", n))
			continue
		}
		out = append(out, e)
	}
	if len(unknown) > 0 {
		known := make([]string, 0, len(editsReg))
		for n := range editsReg {
			known = append(known, n)
		}
		sort.Strings(known)
		if len(known) == 0 {
			known = []string{"none registered"}
		}
		return out, fmt.Errorf("%w: %s (known: %s)", ErrUnknownEdit, strings.Join(unknown, ", "), strings.Join(known, ", "))
	}
	return out, nil
}

// applyEdits applies edits to body, in order, and returns the body to
// forward and what each edit that removed something (or failed) did. An
// edit that fails leaves the body as the edits before it made it.
func applyEdits(edits []Edit, path string, body []byte) ([]byte, []trajectory.Edit) {
	var done []trajectory.Edit
	for _, e := range edits {
		out, removed, err := e.Apply(path, body)
		switch {
		case err != nil:
			done = append(done, trajectory.Edit{Name: e.Name, Error: err.Error()})
		case len(removed) > 0:
			body = out
			done = append(done, trajectory.Edit{Name: e.Name, Removed: removed})
		}
	}
	return body, done
}

// topLevelValue returns where the value of key is in the JSON object
// body: [start, end), or start -1 when the object has no such key. An
// edit splices its new value there, keeping the rest of the body byte for
// byte.
func topLevelValue(body []byte, key string) (start, end int, err error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return -1, -1, errors.New("the body is not a JSON object")
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return -1, -1, err
		}
		k, _ := t.(string)
		after := int(dec.InputOffset())
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return -1, -1, err
		}
		if k != key {
			continue
		}
		end := int(dec.InputOffset())
		i := bytes.IndexByte(body[after:end], ':')
		if i < 0 {
			return -1, -1, fmt.Errorf("no value for %q", key)
		}
		start := after + i + 1
		for start < end && (body[start] == ' ' || body[start] == '\t' || body[start] == '\n' || body[start] == '\r') {
			start++
		}
		return start, end, nil
	}
	return -1, -1, nil
}
