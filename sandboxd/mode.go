package sandboxd

import "github.com/stillpoint/stillpoint/sandboxd/sandboxapi"

// modeScan is the pause strategy the tree walk replaced, a full /proc scan
// (scanStop); not a mode callers can ask for: only BenchmarkPause uses it,
// as a baseline.
const modeScan sandboxapi.Mode = 255
