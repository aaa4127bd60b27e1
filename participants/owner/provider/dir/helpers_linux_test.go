//go:build linux

package dir

import (
	"testing"

	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/providertest"
)

func TestMain(m *testing.M) { leak.VerifyTestMain(m) }

// newDir returns a dir provider with its own state dir, and registers a
// cleanup that stops what is left, deletes every snapshot and then checks
// that nothing is left.
func newDir(t testing.TB) *Provider {
	t.Helper()
	d, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { providertest.Cleanup(t, d) })
	return d
}

// The dir provider keeps the contract.
func TestContract(t *testing.T) {
	providertest.Run(t, func(t *testing.T) provider.Provider { return newDir(t) })
}

func newBench(b testing.TB) provider.Provider { return newDir(b) }

func BenchmarkSnapshot(b *testing.B) { providertest.BenchSnapshot(b, newBench) }

func BenchmarkFork(b *testing.B) { providertest.BenchFork(b, newBench) }

func BenchmarkStart(b *testing.B) { providertest.BenchStart(b, newBench) }

// It has the shape of every provider.
var _ provider.Provider = (*Provider)(nil)
