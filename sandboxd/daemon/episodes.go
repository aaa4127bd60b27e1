package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/atomicfile"
	"github.com/stillpoint/stillpoint/sandboxd"
)

func (d *Daemon) episodesFile() string {
	return filepath.Join(d.sup.StateDir(), "episodes.json")
}

// loadEpisodes reads the launches' episodes kept by the last daemon; a
// file that is torn or names what is not a launch or an episode is an
// error naming the file, and is left as it is.
func (d *Daemon) loadEpisodes() (map[string]string, error) {
	b, err := os.ReadFile(d.episodesFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	eps, err := decodeEpisodes(b)
	if err != nil {
		return nil, fmt.Errorf("daemon: state file %s: %w", d.episodesFile(), err)
	}
	return eps, nil
}

// decodeEpisodes checks the bytes of episodes.json: one JSON object from
// launch id to episode key.
func decodeEpisodes(b []byte) (map[string]string, error) {
	eps, err := atomicfile.DecodeJSON[map[string]string](b)
	if err != nil {
		return nil, err
	}
	if eps == nil {
		return nil, errors.New("null, not an object of launch ids")
	}
	for id, key := range eps {
		if err := sandboxd.ValidateID(id); err != nil {
			return nil, fmt.Errorf("launch %q: %w", id, err)
		}
		if _, err := events.ParseEpisode(key); err != nil {
			return nil, fmt.Errorf("launch %s: %w", id, err)
		}
	}
	return eps, nil
}

// saveEpisodes writes the launches' episodes.
func (d *Daemon) saveEpisodes(eps map[string]string) error {
	if err := (atomicfile.JSON[map[string]string]{Path: d.episodesFile()}).Write(eps); err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	return nil
}
