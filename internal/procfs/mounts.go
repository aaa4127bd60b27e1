package procfs

import (
	"strconv"
	"strings"
)

// Mount is one line of a mountinfo file (proc(5)).
type Mount struct {
	// Root is the directory of the file system that is mounted (field 4),
	// "/" unless a subtree is bind-mounted.
	Root string
	// Point is where it is mounted (field 5), relative to the reading
	// process's root.
	Point string
	// FSType is the file system type ("cgroup2", "overlay", ...), the first
	// field after the "-" separator.
	FSType string
}

// ParseMount parses one mountinfo line, undoing the octal escapes of the
// paths (\040 for a space). A line without the fields is not ok.
func ParseMount(line string) (m Mount, ok bool) {
	pre, post, found := strings.Cut(line, " - ")
	if !found {
		return m, false
	}
	f := strings.Fields(pre)
	fstype, _, _ := strings.Cut(post, " ")
	if len(f) < 5 || fstype == "" {
		return m, false
	}
	return Mount{Root: unescape(f[3]), Point: unescape(f[4]), FSType: fstype}, true
}

// unescape undoes mountinfo's octal escapes.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
