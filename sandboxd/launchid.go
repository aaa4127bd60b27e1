package sandboxd

import "fmt"

// ValidateID checks a launch id: 1 to 128 characters from [A-Za-z0-9._-],
// starting with a letter or digit. It is a directory name in the state
// directory, part of a cgroup name and the value of the environment tag.
func ValidateID(id string) error {
	if len(id) == 0 || len(id) > 128 {
		return fmt.Errorf("%w: launch id %q must have 1 to 128 characters", ErrInvalidSpec, id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return fmt.Errorf("%w: launch id %q: character %q at %d (want [A-Za-z0-9][A-Za-z0-9._-]*)", ErrInvalidSpec, id, c, i)
		}
	}
	return nil
}
