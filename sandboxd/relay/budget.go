package relay

// broadcastLocked wakes whoever waits on r.changed (r.mu held).
func (r *Relay) broadcastLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// freeLocked gives n kept bytes back to the budget (r.mu held).
func (r *Relay) freeLocked(n int) {
	if n > 0 {
		r.used -= int64(n)
		r.broadcastLocked()
	}
}

// dropBufLocked frees what attempt a keeps and keeps nothing more of it
// (r.mu held): it was replaced, or its call ended.
func (r *Relay) dropBufLocked(a *attempt) {
	if a == nil || a.released {
		return
	}
	r.freeLocked(len(a.buf) + a.kept)
	a.buf, a.kept, a.released = nil, 0, true
}

// trimLocked drops the first n bytes of a's buffer, consumed (r.mu
// held).
func (r *Relay) trimLocked(a *attempt, n int) {
	if n == 0 {
		return
	}
	a.buf = append([]byte(nil), a.buf[n:]...)
	a.off += int64(n)
	r.freeLocked(n)
}
