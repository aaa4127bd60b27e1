//go:build linux

package microvm

import (
	"os"
	"testing"

	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/providertest"
)

func TestMain(m *testing.M) {
	if state := os.Getenv(microvmOwnerEnv); state != "" {
		os.Exit(microvmOwnerMain(state))
	}
	leak.VerifyTestMain(m)
}

// The microvm provider keeps the contract. It boots VMs: make test runs
// it, make test-short does not.
func TestContract(t *testing.T) {
	tier.Long(t)
	providertest.Run(t, func(t *testing.T) provider.Provider {
		m := newMicroVM(t, t.TempDir())
		t.Cleanup(func() { cleanupMicroVM(t, m) })
		return m
	})
}

// It has the shape of every provider.
var _ provider.Provider = (*Provider)(nil)
