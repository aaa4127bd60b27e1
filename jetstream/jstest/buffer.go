package jstest

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer that the servers, members and processes a test
// runs may write to while the test reads it. It has no ReadFrom, so os/exec
// copies a process's output into it through Write, under the lock.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
