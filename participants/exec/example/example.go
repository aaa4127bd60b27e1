package example

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// SandboxDir is where spec.json expects the folder in a sandbox.
const SandboxDir = "/opt/stillpoint/exec"

// The files of the example.
const (
	// Agent is the agent's program.
	Agent = "agent.py"
	// SpecFile is its harness spec.
	SpecFile = "spec.json"
)

// Files holds agent.py and spec.json.
//
//go:embed agent.py spec.json
var Files embed.FS

// Write writes the example's files into dir (made if need be), agent.py
// executable, and returns the path of its spec.
func Write(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("example: %w", err)
	}
	for _, name := range []string{Agent, SpecFile} {
		b, err := fs.ReadFile(Files, name)
		if err != nil {
			return "", fmt.Errorf("example: %w", err)
		}
		mode := os.FileMode(0o644)
		if name == Agent {
			mode = 0o755
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, mode); err != nil {
			return "", fmt.Errorf("example: %w", err)
		}
	}
	return filepath.Join(dir, SpecFile), nil
}
