package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type state struct {
	V   int    `json:"v"`
	Run string `json:"run"`
}

// TestJSONRoundTrip: what a write puts in the file, compact or indented,
// durable or not, a read gives back, with the mode asked for.
func TestJSONRoundTrip(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		f    JSON[state]
		want string
		mode os.FileMode
	}{
		{JSON[state]{Path: filepath.Join(dir, "a.json")}, `{"v":1,"run":"r1"}`, 0o644},
		{JSON[state]{Path: filepath.Join(dir, "b.json"), Perm: 0o600, Indent: true}, "{\n  \"v\": 1,\n  \"run\": \"r1\"\n}\n", 0o600},
	} {
		for _, write := range []func(state) error{c.f.Write, c.f.Replace} {
			if err := write(state{V: 1, Run: "r1"}); err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(c.f.Path); string(b) != c.want {
				t.Errorf("%s holds %q, want %q", c.f.Path, b, c.want)
			}
			if fi, err := os.Stat(c.f.Path); err != nil || fi.Mode().Perm() != c.mode {
				t.Errorf("%s: mode %v, %v; want %v", c.f.Path, fi.Mode(), err, c.mode)
			}
			if v, err := c.f.Read(); err != nil || v != (state{V: 1, Run: "r1"}) {
				t.Errorf("%s reads %+v, %v", c.f.Path, v, err)
			}
		}
	}
}

// TestJSONReadErrors: a missing file is fs.ErrNotExist; content that is
// not one whole value of the type is an error naming the file and what is
// wrong; the file is left as it is.
func TestJSONReadErrors(t *testing.T) {
	f := JSON[state]{Path: filepath.Join(t.TempDir(), "state.json")}
	if _, err := f.Read(); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a missing file: %v, want fs.ErrNotExist", err)
	}
	for _, c := range []struct{ name, body, want string }{
		{"empty", "", "empty (0 bytes): torn by a crash?"},
		{"blank", " \n", "empty (2 bytes)"},
		{"torn", `{"v":1,"ru`, "torn or not JSON (10 bytes)"},
		{"another shape", `{"v":"one"}`, "torn or not JSON"},
		{"two objects", `{} {}`, "trailing data after the JSON object (5 bytes)"},
	} {
		if err := os.WriteFile(f.Path, []byte(c.body), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := f.Read()
		if err == nil || !strings.HasPrefix(err.Error(), f.Path+": ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q naming %s", c.name, err, c.want, f.Path)
		}
		if b, _ := os.ReadFile(f.Path); string(b) != c.body {
			t.Errorf("%s: the file was changed to %q", c.name, b)
		}
	}
	if err := os.WriteFile(f.Path, []byte("  {\"v\":2}\n  "), 0o644); err != nil {
		t.Fatal(err)
	}
	if v, err := f.Read(); err != nil || v.V != 2 {
		t.Errorf("a value with white space around it: %+v, %v", v, err)
	}
}

// TestJSONWriteError: a value that does not encode is an error naming the
// file, and the old content stays.
func TestJSONWriteError(t *testing.T) {
	f := JSON[any]{Path: filepath.Join(t.TempDir(), "state.json")}
	if err := f.Write("old"); err != nil {
		t.Fatal(err)
	}
	if err := f.Write(func() {}); err == nil || !strings.Contains(err.Error(), f.Path) {
		t.Fatalf("writing a func: %v, want an error naming %s", err, f.Path)
	}
	if v, err := f.Read(); err != nil || v != "old" {
		t.Fatalf("after a failed write: %v, %v; want old", v, err)
	}
}

// FuzzDecodeJSON: any bytes never panic the decoder, and what it accepts
// encodes and decodes again to the same value.
func FuzzDecodeJSON(f *testing.F) {
	f.Add([]byte(`{"v":1,"run":"r1"}`))
	f.Add([]byte(`{"v":1,"ru`))
	f.Add([]byte(`{} {}`))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := DecodeJSON[state](b)
		if err != nil {
			return
		}
		p := filepath.Join(t.TempDir(), "s.json")
		if err := (JSON[state]{Path: p}).Write(v); err != nil {
			t.Fatal(err)
		}
		if again, err := (JSON[state]{Path: p}).Read(); err != nil || again != v {
			t.Fatalf("accepted %+v reads back as %+v, %v", v, again, err)
		}
	})
}
