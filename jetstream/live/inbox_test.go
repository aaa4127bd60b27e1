package live_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/jetstream/live"
)

// box is a test inbox that counts its closes.
type box struct {
	seq    uint64
	closed int
}

func (b *box) Close() { b.closed++ }

func open(t *testing.T, s *live.Inboxes[*box], seq uint64) *box {
	t.Helper()
	b := &box{seq: seq}
	if err := s.Open(seq, func() (*box, error) { return b, nil }); err != nil {
		t.Fatal(err)
	}
	return b
}

// An inbox is filed by its sequence from its Open to its Close, opened once
// however often it is asked for.
func TestInboxesFileBySequence(t *testing.T) {
	var s live.Inboxes[*box]
	b := open(t, &s, 4)
	if err := s.Open(4, func() (*box, error) { t.Fatal("opened twice"); return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if got, ok := s.File(4); !ok || got != b {
		t.Fatalf("File(4) = %v %v, want the inbox opened", got, ok)
	}
	if _, ok := s.File(5); ok {
		t.Fatal("File(5) found an inbox never opened")
	}
	s.Close(4)
	if _, ok := s.File(4); ok || b.closed != 1 {
		t.Fatalf("after Close: filed %v, closed %d times, want gone and closed once", ok, b.closed)
	}
	s.Close(4)
	if b.closed != 1 {
		t.Fatalf("closed %d times after a second Close, want once", b.closed)
	}
}

// An inbox whose open fails is not filed.
func TestInboxesOpenError(t *testing.T) {
	var s live.Inboxes[*box]
	boom := errors.New("boom")
	if err := s.Open(1, func() (*box, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("Open: %v, want boom", err)
	}
	if _, ok := s.File(1); ok {
		t.Fatal("an inbox whose open failed is filed")
	}
}

// Opening a phase's inbox closes the untaken inboxes of earlier phases
// beyond Spare, the oldest first; a taken inbox is kept until its Close.
func TestInboxesBoundTheUntaken(t *testing.T) {
	for _, spare := range []int{0, 3} {
		s := live.Inboxes[*box]{Spare: spare}
		var boxes []*box
		for seq := uint64(1); seq <= 10; seq++ {
			boxes = append(boxes, open(t, &s, seq))
			if seq%3 == 0 {
				if _, ok := s.Take(seq); !ok {
					t.Fatalf("spare %d: Take(%d) found no inbox", spare, seq)
				}
			}
		}
		if got := s.Untaken(); got != spare+1 {
			t.Errorf("spare %d: %d untaken inboxes kept, want %d", spare, got, spare+1)
		}
		// Untaken before 10: 1 2 4 5 7 8, of which the newest spare stay.
		untaken := []uint64{1, 2, 4, 5, 7, 8}
		stays := map[uint64]bool{10: true}
		for _, seq := range untaken[len(untaken)-spare:] {
			stays[seq] = true
		}
		for _, b := range boxes {
			kept := b.seq%3 == 0 || stays[b.seq]
			if _, ok := s.File(b.seq); ok != kept || (b.closed == 0) != kept {
				t.Errorf("spare %d: inbox %d filed %v, closed %d times; want kept %v", spare, b.seq, ok, b.closed, kept)
			}
		}
		s.CloseAll()
		for _, b := range boxes {
			if b.closed != 1 {
				t.Errorf("spare %d: inbox %d closed %d times after CloseAll, want once", spare, b.seq, b.closed)
			}
		}
		if s.Untaken() != 0 {
			t.Errorf("spare %d: inboxes left after CloseAll", spare)
		}
	}
}

// Listen returns once the server has the subscription: a message
// published at once from another connection reaches it.
func TestListenIsInPlaceWhenItReturns(t *testing.T) {
	env := jstest.Start(t, jstest.WithoutProvision())
	other, _ := env.Connect(t)
	for i := range 20 {
		got := make(chan *nats.Msg, 1)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		sub, err := live.Listen(ctx, env.Conn, "spl.run1.ack.1.resume.>", func(m *nats.Msg) { got <- m }, 16, 1<<20)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if err := other.Publish("spl.run1.ack.1.resume.agent.a", []byte("ack")); err != nil {
			t.Fatal(err)
		}
		select {
		case <-got:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: a message published right after Listen returned never came", i)
		}
		if err := sub.Unsubscribe(); err != nil {
			t.Fatal(err)
		}
	}
}
