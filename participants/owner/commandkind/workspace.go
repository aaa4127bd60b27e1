package commandkind

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// checkHost checks that the workspace exists on the host and is of the
// kind the task says: a directory, or a file for a tarball.
func (w Workspace) checkHost() error {
	check := func(field, p string, dir bool) error {
		fi, err := os.Stat(p)
		switch {
		case err != nil:
			return fmt.Errorf("%w: workspace.%s: %v", ErrTask, field, err)
		case dir && !fi.IsDir():
			return fmt.Errorf("%w: workspace.%s: %s is not a directory", ErrTask, field, p)
		case !dir && !fi.Mode().IsRegular():
			return fmt.Errorf("%w: workspace.%s: %s is not a regular file", ErrTask, field, p)
		}
		return nil
	}
	switch {
	case w.Dir != "":
		return check("dir", w.Dir, true)
	case w.Tarball != "":
		return check("tarball", w.Tarball, false)
	case w.Git != "":
		return check("git", w.Git, true)
	}
	return nil
}

// empty tells a task without a workspace.
func (w Workspace) empty() bool { return w.Dir == "" && w.Tarball == "" && w.Git == "" }

// writeTar writes the workspace to w as a tar stream whose entries are
// relative to the workspace's top and owned by root; tmp is where a git
// repository is cloned.
func (w Workspace) writeTar(ctx context.Context, out io.Writer, tmp string) error {
	tw := tar.NewWriter(out)
	var err error
	switch {
	case w.Dir != "":
		err = tarDir(ctx, tw, w.Dir)
	case w.Tarball != "":
		err = retar(ctx, tw, w.Tarball)
	case w.Git != "":
		err = tarGit(ctx, tw, w.Git, w.Commit, tmp)
	}
	if err != nil {
		return err
	}
	return tw.Close()
}

// tarDir writes the tree under dir: regular files, directories and
// symbolic links (as links); anything else is refused, naming it.
func tarDir(ctx context.Context, tw *tar.Writer, dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		switch m := fi.Mode(); {
		case m.IsRegular(), m.IsDir():
		case m&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: %s is not a regular file, directory or symbolic link", p, m.Type())
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			h.Name += "/"
		}
		rootOwned(h)
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := io.Copy(tw, f); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		return nil
	})
}

// rootOwned makes an entry root's, whoever owns it on the host.
func rootOwned(h *tar.Header) {
	h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
	h.Format = tar.FormatPAX
}

// retar copies the entries of the tarball at p (plain or gzip) to tw,
// checking each: a name relative and inside the workspace, a type that is
// a file, a directory or a link, a hard link to an entry inside.
func retar(ctx context.Context, tw *tar.Writer, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		defer gz.Close()
		r = gz
	}
	tr := tar.NewReader(r)
	for n := 0; ; n++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if n == 0 {
				return fmt.Errorf("%s: an empty archive", p)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		name, err := entryName(h.Name)
		if err != nil {
			return fmt.Errorf("%s: entry %.200q: %w", p, h.Name, err)
		}
		if name == "" {
			continue // the top directory itself
		}
		switch h.Typeflag {
		case tar.TypeReg, tar.TypeDir, tar.TypeSymlink:
		case tar.TypeLink:
			if h.Linkname, err = entryName(h.Linkname); err != nil || h.Linkname == "" {
				return fmt.Errorf("%s: entry %.200q: a hard link out of the archive", p, h.Name)
			}
		default:
			return fmt.Errorf("%s: entry %.200q: type %q is not a file, directory or link", p, h.Name, h.Typeflag)
		}
		h.Name = name
		if h.Typeflag == tar.TypeDir {
			h.Name += "/"
		}
		rootOwned(h)
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, tr); err != nil {
				return fmt.Errorf("%s: entry %.200q: %w", p, h.Name, err)
			}
		}
	}
}

// entryName cleans an archive entry's name: relative to the workspace,
// "" for its top ("." or "./").
func entryName(name string) (string, error) {
	if path.IsAbs(name) || strings.ContainsRune(name, 0) {
		return "", errors.New("not a relative path")
	}
	if hasDotDot(name) {
		return "", errors.New("escapes the workspace (..)")
	}
	c := path.Clean(name)
	if c == "." {
		return "", nil
	}
	return c, nil
}

// ErrNoGit is wrapped by Setup for a git workspace on a host without the
// git command.
var ErrNoGit = errors.New("commandkind: a git workspace needs the git command on the owner's host (apt-get install git)")

// tarGit clones repo under tmp without network, checks out commit with
// no remote left, and writes the work tree, .git included.
func tarGit(ctx context.Context, tw *tar.Writer, repo, commit, tmp string) error {
	gitBin, err := exec.LookPath("git")
	if err != nil {
		return ErrNoGit
	}
	dir, err := os.MkdirTemp(tmp, "stillpoint-git-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	work := filepath.Join(dir, "w")
	git := func(args ...string) error {
		cmd := exec.CommandContext(ctx, gitBin, args...)
		// Local only: no protocol but file, no prompt, no system config.
		cmd.Env = append(os.Environ(), "GIT_ALLOW_PROTOCOL=file", "GIT_TERMINAL_PROMPT=0", "GIT_CONFIG_NOSYSTEM=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
		return nil
	}
	if err := git("clone", "--quiet", "--no-checkout", "--no-hardlinks", "--", repo, work); err != nil {
		return err
	}
	if err := git("-C", work, "checkout", "--quiet", "--detach", commit+"^{commit}"); err != nil {
		return fmt.Errorf("workspace.commit %s: %w", commit, err)
	}
	if err := git("-C", work, "remote", "remove", "origin"); err != nil {
		return err
	}
	return tarDir(ctx, tw, work)
}
