//go:build linux

package microvm

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/stillpoint/stillpoint/internal/atomicfile"
)

// vmMeta is the vm.json of a sandbox, a snapshot or a template: what its
// disk is made of and, for a running VM, which QEMU runs it.
type vmMeta struct {
	// Chain is the disk's qcow2 layers (paths: under <state>/layers, or a
	// template's), top first; the bottom one's backing file is Base.
	Chain []string `json:"chain"`
	// Pending is a layer being made (a snapshot's new top): kept by the
	// collector although no chain holds it yet.
	Pending string `json:"pending,omitempty"`
	// Base and Harness are the raw root and harness images (cache/images).
	Base    string `json:"base"`
	Harness string `json:"harness"`
	// Image is the manifest digest of the container image Base was built
	// of ("": the provider's base tree).
	Image string `json:"image,omitempty"`
	// HarnessMount is where the guest mounts the harness image, when not
	// at BinDirInGuest (harnessMount): the template's command line, which
	// its forks share.
	HarnessMount string `json:"harness_mount,omitempty"`
	// CPU is the template's CPU model (Config.CPU), which its forks
	// share ("": the default).
	CPU string `json:"cpu,omitempty"`
	// Gen picks the guest address of NATS (10.0.2.(100+Gen)): a fork's
	// differs from its parent's, so the parent's connection, restored in
	// the fork, never reaches the server.
	Gen    int `json:"gen"`
	MemMiB int `json:"mem_mib"`
	// PID and Start name the QEMU process (Start: field 22 of its stat).
	PID   int    `json:"pid,omitempty"`
	Start uint64 `json:"start,omitempty"`
	// NATSHost is the host address NATS connections are relayed to.
	NATSHost string `json:"nats_host,omitempty"`
	// Sandbox is the sandbox a snapshot was taken of.
	Sandbox string `json:"sandbox,omitempty"`
	// RAMFile says a snapshot's RAM is its file "ram", which its forks
	// map copy-on-write, beside its "devices"; without it
	// (Config.FullCopy) the RAM is in the "state" file. RAMPages counts
	// the pages written to the RAM file: a fork refuses one with fewer on
	// disk (a crash of the machine before they reached it).
	RAMFile  bool  `json:"ram_file,omitempty"`
	RAMPages int64 `json:"ram_pages,omitempty"`
}

// vmFile is the vm.json of dir.
func vmFile(dir string) atomicfile.JSON[vmMeta] {
	return atomicfile.JSON[vmMeta]{Path: filepath.Join(dir, "vm.json"), Perm: 0o600, Indent: true}
}

// layer is the path of a disk layer.
func (m *Provider) layer(name string) string { return filepath.Join(m.layers, name+".qcow2") }

func newLayerName() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:6])
}

// gc removes the disk layers no sandbox, snapshot or template holds. It
// lists the layers before it reads who holds them, and a layer is made
// only after a vm.json names it: a layer made meanwhile is not listed.
func (m *Provider) gc() error {
	m.gcMu.Lock()
	defer m.gcMu.Unlock()
	ents, err := os.ReadDir(m.layers)
	if err != nil {
		return err
	}
	held := map[string]bool{}
	for _, parent := range []string{filepath.Join(m.cfg.StateDir, "sandboxes"), filepath.Join(m.cfg.StateDir, "snapshots")} {
		dirs, err := os.ReadDir(parent)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		for _, d := range dirs {
			m.holdLayers(held, filepath.Join(parent, d.Name()))
		}
	}
	var errs []error
	for _, e := range ents {
		if held[filepath.Join(m.layers, e.Name())] {
			continue
		}
		if err := os.Remove(filepath.Join(m.layers, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// holdLayers marks the layers dir's vm.json names, also in a snapshot
// being made or deleted (".tmp-" and ".del-" directories hold one level
// more).
func (m *Provider) holdLayers(held map[string]bool, dir string) {
	meta, err := vmFile(dir).Read()
	if err != nil {
		subs, _ := os.ReadDir(dir)
		for _, s := range subs {
			if s.IsDir() {
				if meta, err := vmFile(filepath.Join(dir, s.Name())).Read(); err == nil {
					markChain(held, meta)
				}
			}
		}
		return
	}
	markChain(held, meta)
}

func markChain(held map[string]bool, meta vmMeta) {
	for _, l := range meta.Chain {
		held[l] = true
	}
	if meta.Pending != "" {
		held[meta.Pending] = true
	}
}
