package atomicfile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
)

// JSON is a state file that holds one JSON value of type T: where it is,
// its mode and its layout, so that every write of it is alike.
type JSON[T any] struct {
	// Path is the file.
	Path string
	// Perm is the mode a write creates the file with; 0644 when zero.
	Perm os.FileMode
	// Indent writes the value indented by two spaces, with a final
	// newline, for a file people read; otherwise it is one compact line.
	Indent bool
}

// Read returns the file's value. A file that cannot be read is os's error
// (fs.ErrNotExist when there is none); content that does not decode
// (DecodeJSON) is an error "<path>: <what is wrong>". Both name the file;
// a file that does not decode is left as it is.
func (f JSON[T]) Read() (T, error) {
	b, err := os.ReadFile(f.Path)
	if err != nil {
		var zero T
		return zero, err
	}
	v, err := DecodeJSON[T](b)
	if err != nil {
		return v, fmt.Errorf("%s: %w", f.Path, err)
	}
	return v, nil
}

// Write replaces the file with v durably (the package's Write): it
// survives a crash of the machine.
func (f JSON[T]) Write(v T) error { return f.write(v, Write) }

// Replace replaces the file with v atomically but without the fsyncs (the
// package's Replace): for a state rewritten often whose loss with the
// machine is harmless.
func (f JSON[T]) Replace(v T) error { return f.write(v, Replace) }

func (f JSON[T]) write(v T, replace func(string, []byte, os.FileMode) error) error {
	var b []byte
	var err error
	if f.Indent {
		b, err = json.MarshalIndent(v, "", "  ")
		b = append(b, '\n')
	} else {
		b, err = json.Marshal(v)
	}
	if err != nil {
		return fmt.Errorf("atomicfile: encode %s: %w", f.Path, err)
	}
	perm := f.Perm
	if perm == 0 {
		perm = 0o644
	}
	return replace(f.Path, b, perm)
}

// DecodeJSON decodes b as one whole JSON value of T, with white space
// around it: the check JSON.Read makes of a file's bytes, for a decoder
// that is tested or fuzzed without a file. Its error says what is wrong:
// empty, torn or not JSON, or trailing data.
func DecodeJSON[T any](b []byte) (T, error) {
	var v T
	t := bytes.TrimSpace(b)
	if len(t) == 0 {
		return v, fmt.Errorf("empty (%d bytes): torn by a crash?", len(b))
	}
	dec := json.NewDecoder(bytes.NewReader(t))
	if err := dec.Decode(&v); err != nil {
		var zero T
		return zero, fmt.Errorf("torn or not JSON (%d bytes): %w", len(b), err)
	}
	if dec.More() {
		var zero T
		return zero, fmt.Errorf("trailing data after the JSON object (%d bytes)", len(b))
	}
	return v, nil
}
