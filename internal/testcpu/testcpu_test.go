package testcpu

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/leak"
)

func TestMain(m *testing.M) {
	if os.Getenv("TESTCPU_HOLD") != "" {
		// A process that takes every slot of the pool and waits to be killed.
		Dir = os.Getenv("TESTCPU_HOLD")
		if _, err := take(context.Background(), Quarters); err != nil {
			os.Exit(2)
		}
		os.Stdout.WriteString("held\n")
		select {}
	}
	leak.VerifyTestMain(m)
}

// pool points the package at a pool of its own, of q slots, for t.
func pool(t *testing.T, q int) {
	dir, quarters := Dir, Quarters
	Dir, Quarters = t.TempDir(), q
	t.Cleanup(func() { Dir, Quarters = dir, quarters })
}

// free checks that q slots can be taken (waiting for them), and gives
// them back.
func free(t *testing.T, q int, what string) {
	t.Helper()
	held, err := take(t.Context(), q)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	release(held)
}

// taken checks that q slots cannot be taken within a few retries.
func taken(t *testing.T, q int, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*retry)
	defer cancel()
	if held, err := take(ctx, q); err == nil {
		release(held)
		t.Errorf("took %d slots %s", q, what)
	}
}

func TestTakeWaitsForTheSlotsAnotherHolds(t *testing.T) {
	pool(t, 4)
	first, err := take(t.Context(), 3)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		held, err := take(t.Context(), 2)
		release(held)
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("took 2 of 4 slots while another held 3 (%v)", err)
	case <-time.After(10 * retry):
	}
	release(first)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

func TestTakeGivesUpWhenItsContextEnds(t *testing.T) {
	pool(t, 2)
	first, err := take(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer release(first)
	ctx, cancel := context.WithTimeout(t.Context(), 5*retry)
	defer cancel()
	if _, err := take(ctx, 2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("take of more than is free, until a deadline: %v, want the deadline", err)
	}
	free(t, 1, "what a take that gave up had gathered")
}

func TestADeadProcessHoldsNothing(t *testing.T) {
	pool(t, 4)
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), "TESTCPU_HOLD="+Dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	buf := make([]byte, 5)
	if _, err := out.Read(buf); err != nil || string(buf) != "held\n" {
		t.Fatalf("the holding process: %q %v", buf, err)
	}
	taken(t, 1, "while another process held every one")
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	free(t, 4, "the slots of a killed process")
}

func TestTakeRoundsUpAndHoldsUntilTheTestEnds(t *testing.T) {
	pool(t, 4)
	t.Run("holder", func(t *testing.T) {
		Take(t, 0.3) // more than a quarter: two
		taken(t, 3, "of 4 while a test held 0.3 of a core")
		free(t, 2, "the other two")
	})
	free(t, 4, "the slots after the test that held them ended")
}

// TestATestHoldsOneShare: a second Take in a test, or one in its subtest,
// takes nothing more: with another test holding the rest of the pool it
// would wait for ever.
func TestATestHoldsOneShare(t *testing.T) {
	pool(t, 4)
	Take(t, 1)
	Take(t, 1) // again: returns at once, though every slot is taken
	t.Run("sub", func(t *testing.T) {
		Take(t, 0.5) // the parent's share covers it
	})
	taken(t, 1, "while the test held all four")
}
