package sandboxd

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// User is who a launch runs as (Config.LaunchUser resolved): the uid,
// the primary gid and the supplementary groups.
type User struct {
	UID    uint32
	GID    uint32
	Groups []uint32
}

// ResolveUser resolves a container image's user, as an OCI image config
// writes it (user, uid, user:group, uid:gid, and mixed), against
// root/etc/passwd and root/etc/group: a name must be in them; a uid
// missing from passwd gets gid 0 unless one is given. The supplementary
// groups are the groups that list the user's name, as a login would give
// (none for a uid not in passwd).
func ResolveUser(spec, root string) (User, error) {
	name, group, hasGroup := strings.Cut(spec, ":")
	if name == "" || (hasGroup && group == "") {
		return User{}, fmt.Errorf("%w: Config.LaunchUser %q: want user, uid, user:group or uid:gid", ErrInvalidConfig, spec)
	}
	passwd, err := readColon(filepath.Join(root, "etc/passwd"))
	if err != nil {
		return User{}, fmt.Errorf("%w: Config.LaunchUser %q: %w", ErrInvalidConfig, spec, err)
	}
	groups, err := readColon(filepath.Join(root, "etc/group"))
	if err != nil {
		return User{}, fmt.Errorf("%w: Config.LaunchUser %q: %w", ErrInvalidConfig, spec, err)
	}
	var u User
	userName := ""
	if id, ok := parseID(name); ok {
		u.UID = id
		for _, f := range passwd { // name:x:uid:gid:...
			if len(f) >= 4 && f[2] == name {
				userName = f[0]
				if gid, ok := parseID(f[3]); ok {
					u.GID = gid
				}
				break
			}
		}
	} else {
		found := false
		for _, f := range passwd {
			if len(f) >= 4 && f[0] == name {
				uid, ok1 := parseID(f[2])
				gid, ok2 := parseID(f[3])
				if !ok1 || !ok2 {
					return User{}, fmt.Errorf("%w: Config.LaunchUser %q: /etc/passwd has a bad entry for %s", ErrInvalidConfig, spec, name)
				}
				u.UID, u.GID, userName, found = uid, gid, name, true
				break
			}
		}
		if !found {
			return User{}, fmt.Errorf("%w: Config.LaunchUser %q: no user %s in %s", ErrInvalidConfig, spec, name, filepath.Join(root, "etc/passwd"))
		}
	}
	if hasGroup {
		if gid, ok := parseID(group); ok {
			u.GID = gid
		} else {
			found := false
			for _, f := range groups { // name:x:gid:members
				if len(f) >= 3 && f[0] == group {
					if gid, ok := parseID(f[2]); ok {
						u.GID, found = gid, true
					}
					break
				}
			}
			if !found {
				return User{}, fmt.Errorf("%w: Config.LaunchUser %q: no group %s in %s", ErrInvalidConfig, spec, group, filepath.Join(root, "etc/group"))
			}
		}
	}
	if userName != "" {
		for _, f := range groups {
			if len(f) < 4 {
				continue
			}
			gid, ok := parseID(f[2])
			if !ok {
				continue
			}
			for _, m := range strings.Split(f[3], ",") {
				if m == userName {
					u.Groups = append(u.Groups, gid)
				}
			}
		}
	}
	return u, nil
}

// parseID parses a uid or gid.
func parseID(s string) (uint32, bool) {
	n, err := strconv.ParseUint(s, 10, 32)
	return uint32(n), err == nil
}

// readColon reads a colon-separated file (passwd, group): its lines'
// fields; a missing file has none.
func readColon(p string) ([][]string, error) {
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out [][]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		out = append(out, strings.Split(line, ":"))
	}
	return out, sc.Err()
}

// ReadLaunchUser reads the user a launch-user file names (its first
// line, trimmed); a missing file names none ("").
func ReadLaunchUser(p string) (string, error) {
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(line), nil
}
