package microvm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
)

// Ext4Image builds a raw ext4 image of size bytes at dst whose root holds
// dir's tree (mkfs.ext4 -d), owned by root, labelled label. The image is
// written under a temporary name and renamed, so dst is whole or absent.
func Ext4Image(ctx context.Context, mkfs, dir, dst, label string, size int64) error {
	tmp := fmt.Sprintf("%s/.tmp-%d-%s", filepath.Dir(dst), os.Getpid(), filepath.Base(dst))
	_ = os.Remove(tmp)
	cmd := exec.CommandContext(ctx, mkfs, "-q", "-F", "-t", "ext4", "-L", label, "-d", dir,
		"-E", "root_owner=0:0", "-O", "^has_journal", "-m", "0", tmp, strconv.FormatInt(size/1024, 10)+"k")
	cmd.Env = append(os.Environ(), "E2FSPROGS_FAKE_TIME=1") // the same tree gives the same image
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("mkfs.ext4 -d %s: %w: %s", dir, err, out)
	}
	return os.Rename(tmp, dst)
}

// Overlay creates a qcow2 image at dst whose backing file is base (format
// "raw" or "qcow2"): writes go to dst, reads of what it does not hold go
// to base, which must not change afterwards.
func Overlay(ctx context.Context, qemuImg, base, baseFormat, dst string) error {
	out, err := exec.CommandContext(ctx, qemuImg, "create", "-q", "-f", "qcow2", "-b", base, "-F", baseFormat, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img create %s on %s: %w: %s", dst, base, err, out)
	}
	return nil
}
