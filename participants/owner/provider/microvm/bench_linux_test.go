//go:build linux

package microvm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/providertest"
)

// vmRSS reads a process's resident set size in bytes (VmRSS).
func vmRSS(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// BenchmarkMicroVM measures the microvm provider on 256 MiB guests, one
// figure per sub-benchmark (run with -benchtime 1x): a cold boot against
// a start from the warm template, the VM's pause at a snapshot and the
// state's bytes, a fork of the snapshot, and the RSS of each kind of VM.
// A counter runs in the guest, as a harness would.
func BenchmarkMicroVM(b *testing.B) {
	requireMicroVM(b)
	m := newMicroVM(b, b.TempDir())
	defer cleanupMicroVM(b, m)
	ctx := context.Background()
	b.Run("ColdBoot", func(b *testing.B) {
		base, err := m.baseImage(ctx)
		if err != nil {
			b.Fatal(err)
		}
		harness, err := m.harnessImage(ctx, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			t := &template{key: "bench", dir: filepath.Join(b.TempDir(), "template")}
			t0 := time.Now()
			if err := m.bootTemplate(ctx, t, base, harness); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(time.Since(t0).Seconds(), "s/boot")
		}
	})
	b.Run("StartFromTemplate", func(b *testing.B) {
		providertest.Start(b, m, provider.Spec{ID: "warmup", Init: counterInit, Workdir: "/work"}) // the template boots here
		i := 0
		for b.Loop() {
			i++
			id := fmt.Sprintf("s%d", i)
			t0 := time.Now()
			sb := providertest.Start(b, m, provider.Spec{ID: id, Init: counterInit, Workdir: "/work"})
			b.ReportMetric(time.Since(t0).Seconds(), "s/start")
			waitCounter(b, m, id, 3)
			b.ReportMetric(float64(vmRSS(sb.InitPID))/(1<<20), "MiB-RSS")
		}
	})
	b.Run("Snapshot", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i++
			s, err := m.Snapshot(ctx, "warmup", fmt.Sprintf("snap%d", i))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(s.Took.Seconds()*1000, "ms-paused")
			b.ReportMetric(float64(s.Size)/(1<<20), "MiB-state")
		}
	})
	b.Run("Fork", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i++
			id := fmt.Sprintf("f%d", i)
			t0 := time.Now()
			sb, err := m.Fork(ctx, "snap1", provider.Spec{ID: id, Init: counterInit, Workdir: "/work", Epoch: 2})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(time.Since(t0).Seconds(), "s/fork")
			last, _ := counter(b, m, id)
			waitCounter(b, m, id, last+3)
			b.ReportMetric(float64(vmRSS(sb.InitPID))/(1<<20), "MiB-RSS")
		}
	})
}

// BenchmarkMicroVM16 takes 16 concurrent sandboxes through a checkpoint
// (16 snapshots at once) and a restore (16 forks at once), as an owner
// does at a commit and a restore (make bench); under -short, 2 (make
// test).
func BenchmarkMicroVM16(b *testing.B) {
	requireMicroVM(b)
	m := newMicroVM(b, b.TempDir())
	defer cleanupMicroVM(b, m)
	ctx := context.Background()
	n := tier.Pick(16, 2)
	each := func(f func(i int) error) time.Duration {
		t0 := time.Now()
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() { errs[i] = f(i) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	providertest.Start(b, m, provider.Spec{ID: "warmup", Init: counterInit, Workdir: "/work"})
	for b.Loop() {
		started := each(func(i int) error {
			_, err := m.Start(ctx, provider.Spec{ID: fmt.Sprintf("v%d", i), Init: counterInit, Workdir: "/work"})
			return err
		})
		paused := make([]time.Duration, n)
		bytes := make([]int64, n)
		checkpoint := each(func(i int) error {
			s, err := m.Snapshot(ctx, fmt.Sprintf("v%d", i), fmt.Sprintf("c%d", i))
			paused[i], bytes[i] = s.Took, s.Size
			return err
		})
		restore := each(func(i int) error {
			_, err := m.Fork(ctx, fmt.Sprintf("c%d", i), provider.Spec{ID: fmt.Sprintf("r%d", i), Init: counterInit, Workdir: "/work", Epoch: 2})
			return err
		})
		var maxPause time.Duration
		var total int64
		for i := range n {
			maxPause = max(maxPause, paused[i])
			total += bytes[i]
		}
		b.ReportMetric(started.Seconds(), fmt.Sprintf("s-start%d", n))
		b.ReportMetric(checkpoint.Seconds(), fmt.Sprintf("s-checkpoint%d", n))
		b.ReportMetric(maxPause.Seconds()*1000, "ms-max-paused")
		b.ReportMetric(float64(total)/(1<<20), fmt.Sprintf("MiB-state%d", n))
		b.ReportMetric(restore.Seconds(), fmt.Sprintf("s-restore%d", n))
		var rss int64
		for _, id := range m.Sandboxes() {
			if box, err := m.boxes.Get(id); err == nil && box.vm != nil {
				rss += vmRSS(box.vm.pid)
			}
		}
		b.ReportMetric(float64(rss)/(1<<20), "MiB-RSS-all")
		for i := range n {
			for _, id := range []string{fmt.Sprintf("v%d", i), fmt.Sprintf("r%d", i)} {
				if err := m.Stop(ctx, id); err != nil {
					b.Fatal(err)
				}
			}
			if err := m.DeleteSnapshot(ctx, fmt.Sprintf("c%d", i)); err != nil {
				b.Fatal(err)
			}
		}
	}
}
