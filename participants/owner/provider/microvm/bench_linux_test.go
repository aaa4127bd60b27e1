//go:build linux

package microvm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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

// BenchmarkMicroVM measures the microvm provider on 256 MiB guests (run
// with -benchtime 1x; each figure the median of a few): a cold boot
// against a start from the warm template, the VM's pause at a snapshot
// and the snapshot's bytes, a fork of the snapshot, and the RSS of each
// kind of VM, for snapshots with RAM files and for the full-copy design
// (Config.FullCopy) in the same run. Ratios ends it: fork/start,
// forkRSS/startRSS and pause/pause-before, the figures docs/BENCHMARKS.md
// records. A counter runs in the guest, as a harness would.
func BenchmarkMicroVM(b *testing.B) {
	requireMicroVM(b)
	m := newMicroVM(b, b.TempDir())
	defer cleanupMicroVM(b, m)
	ctx := context.Background()
	each := tier.Pick(5, 2) // rounds; under -short (bench-once), 2
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
	// The designs and the start go round by round, each VM stopped once
	// measured: every figure is taken beside the same VMs (the warm-up
	// one), whatever the machine does meanwhile.
	b.Run("Rounds", func(b *testing.B) {
		providertest.Start(b, m, provider.Spec{ID: "warmup", Init: counterInit, Workdir: "/work"}) // the template boots here
		var starts, startRSS []float64
		forks, forkRSS, paused, size := map[bool][]float64{}, map[bool][]float64{}, map[bool][]float64{}, map[bool][]float64{}
		design := map[bool]string{true: "full", false: "ram"}
		run := func(id string, start func() (*provider.Sandbox, error)) (took, rss float64) {
			t0 := time.Now()
			sb, err := start()
			if err != nil {
				b.Fatal(err)
			}
			took = time.Since(t0).Seconds()
			last, _ := counter(b, m, id)
			waitCounter(b, m, id, last+3)
			rss = float64(vmRSS(sb.InitPID)) / (1 << 20)
			if err := m.Stop(ctx, id); err != nil {
				b.Fatal(err)
			}
			return took, rss
		}
		for b.Loop() {
			for i := range each {
				// Which design goes first alternates: neither always
				// snapshots after the other's writes.
				order := []bool{i%2 == 0, i%2 != 0}
				for _, full := range order {
					m.cfg.FullCopy = full
					s, err := m.Snapshot(ctx, "warmup", fmt.Sprintf("snap-%s%d", design[full], i))
					m.cfg.FullCopy = false
					if err != nil {
						b.Fatal(err)
					}
					paused[full] = append(paused[full], s.Took.Seconds()*1000)
					size[full] = append(size[full], float64(s.Size)/(1<<20))
				}
				id := fmt.Sprintf("s%d", i)
				took, rss := run(id, func() (*provider.Sandbox, error) {
					return m.Start(ctx, provider.Spec{ID: id, Init: counterInit, Workdir: "/work"})
				})
				starts, startRSS = append(starts, took), append(startRSS, rss)
				for _, full := range order {
					id := fmt.Sprintf("f-%s%d", design[full], i)
					took, rss := run(id, func() (*provider.Sandbox, error) {
						return m.Fork(ctx, fmt.Sprintf("snap-%s%d", design[full], i), provider.Spec{ID: id, Init: counterInit, Workdir: "/work", Epoch: 2})
					})
					forks[full], forkRSS[full] = append(forks[full], took), append(forkRSS[full], rss)
				}
			}
		}
		b.ReportMetric(median(starts), "s/start")
		b.ReportMetric(median(startRSS), "MiB-RSS-start")
		for _, full := range []bool{true, false} {
			suffix := map[bool]string{true: "-before", false: ""}[full]
			b.ReportMetric(median(paused[full]), "ms-paused"+suffix)
			b.ReportMetric(median(size[full]), "MiB-snapshot"+suffix)
			b.ReportMetric(median(forks[full]), "s/fork"+suffix)
			b.ReportMetric(median(forkRSS[full]), "MiB-RSS-fork"+suffix)
			b.ReportMetric(median(forks[full])/median(starts), "fork"+suffix+"/start")
			b.ReportMetric(median(forkRSS[full])/median(startRSS), "forkRSS"+suffix+"/startRSS")
		}
		b.ReportMetric(median(paused[false])/median(paused[true]), "pause/pause-before")
	})
}

// median returns the median of v (0 for none).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// BenchmarkMicroVM16 takes 16 concurrent sandboxes through a checkpoint
// (16 snapshots at once) and a restore (16 forks at once), as an owner
// does at a commit and a restore (make bench), with the full-copy design
// and then with RAM files, in one run; under -short, 2 (make test). It
// reports restore16/start16, 16 forks at once against 16 starts at once,
// for each: the started sandboxes are stopped before the restore, as a
// crash's are, so that both run beside the same VMs.
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
		for _, full := range []bool{true, false} {
			m.cfg.FullCopy = full
			suffix := map[bool]string{true: "-before", false: ""}[full]
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
			rssOf := func(prefix string) (mib float64) {
				for i := range n {
					if box, err := m.boxes.Get(fmt.Sprintf("%s%d", prefix, i)); err == nil && box.vm != nil {
						mib += float64(vmRSS(box.vm.pid)) / (1 << 20)
					}
				}
				return mib
			}
			snapRSS := rssOf("v") // after the checkpoint: its migration read all of their RAM
			// The restore comes after a crash, the sandboxes it forks gone:
			// the forks run on a host as idle as the starts did.
			each(func(i int) error { return m.Stop(ctx, fmt.Sprintf("v%d", i)) })
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
			b.ReportMetric(started.Seconds(), fmt.Sprintf("s-start%d%s", n, suffix))
			b.ReportMetric(checkpoint.Seconds(), fmt.Sprintf("s-checkpoint%d%s", n, suffix))
			b.ReportMetric(maxPause.Seconds()*1000, "ms-max-paused"+suffix)
			b.ReportMetric(float64(total)/(1<<20), fmt.Sprintf("MiB-state%d%s", n, suffix))
			b.ReportMetric(restore.Seconds(), fmt.Sprintf("s-restore%d%s", n, suffix))
			b.ReportMetric(restore.Seconds()/started.Seconds(), fmt.Sprintf("restore%d%s/start%d", n, suffix, n))
			b.ReportMetric(snapRSS, fmt.Sprintf("MiB-RSS-snapshotted%d%s", n, suffix))
			b.ReportMetric(rssOf("r"), fmt.Sprintf("MiB-RSS-restore%d%s", n, suffix))
			for i := range n {
				if err := m.Stop(ctx, fmt.Sprintf("r%d", i)); err != nil {
					b.Fatal(err)
				}
				if err := m.DeleteSnapshot(ctx, fmt.Sprintf("c%d", i)); err != nil {
					b.Fatal(err)
				}
			}
		}
		m.cfg.FullCopy = false
	}
}
