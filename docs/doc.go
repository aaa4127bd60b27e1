// Package docs holds the project's documentation pages (*.md beside this
// file) and the tests that keep them and the code's own documentation true:
//
//   - every package has a doc.go that carries its package comment
//     ("Package <name> ..." or, for a main package, "Command <dir> ...");
//   - every exported name has a doc comment that starts with the name;
//   - every path/file.go that ARCHITECTURE.md names exists, and every
//     function, method or type it names in that file is declared there;
//   - no table cell of ARCHITECTURE.md holds more than 300 characters;
//   - every § reference of the code and of these pages names a section
//     that PROTOCOL.md has or, written "PROTOCOL-HISTORY §N", an entry of
//     the protocol's change log, PROTOCOL-HISTORY.md, whose entries are
//     numbered 1, 2, 3 … in order.
//
// `make lint` runs them (go test ./docs); so does `make test`.
package docs
