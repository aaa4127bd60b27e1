// Package golden runs the pure cores' golden scripts: files of input lines,
// each followed by the lines the core is expected to answer, indented two
// spaces. The tests of controller-bridge/machine and sandboxd/daemon drive
// their Step through it; with -update the answers are written back.
package golden
