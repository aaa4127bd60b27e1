package member

import (
	"context"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/member/feed"
)

// WriteRecordsPaced is WriteRecords calling before(index) ahead of each
// record, so that a test can stop a write in the middle of the store's
// write.
func WriteRecordsPaced(ctx context.Context, store natsjs.ObjectStore, run, checkpoint string, m events.Member,
	records []events.Record, before func(index int)) (events.MemberManifest, error) {
	return writeRecords(ctx, store, run, checkpoint, m, records, writeHooks{before: before})
}

// WriteRecordsNoResponders is WriteRecords calling noResponders(try)
// after each write that found no responders, before it is sent again.
func WriteRecordsNoResponders(ctx context.Context, store natsjs.ObjectStore, run, checkpoint string, m events.Member,
	records []events.Record, noResponders func(try int)) (events.MemberManifest, error) {
	return writeRecords(ctx, store, run, checkpoint, m, records, writeHooks{noResponders: noResponders})
}

// LoseCoreArrivals makes the core feed of m (Config.StateFile) lose the
// next n messages its subscription receives, as a subscription that was
// not up when they were published. Call it once m has joined.
func LoseCoreArrivals(m *Member, n int) { m.feed.(*feed.Core).Lose(n) }

// CoreCatchUps returns how many times the core feed of m has read the
// stream to catch up (at start, at a reconnect, at a gap).
func CoreCatchUps(m *Member) int64 { return m.feed.(*feed.Core).CatchUps() }

// ConsumeError hands err to m's loop as its consumer's error handler
// does, once m has joined.
func ConsumeError(m *Member, err error) { m.consumeErrs <- err }

// Repulls returns how many times m pulled from its consumer again after a
// pull found no responders.
func Repulls(m *Member) int64 { return m.repulls.Load() }

// AckID returns the id m gives its ack to phase p of sequence seq, were it
// to publish it now.
func AckID(m *Member, seq uint64, p events.Phase) string { return m.ackID(seq, p) }
