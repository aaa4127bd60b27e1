// Package snapstore is a provider's snapshot store, <state>/snapshots: one
// directory per snapshot with its meta.json, built under a temporary name
// and renamed into place, so that a snapshot is complete or absent
// (the provider contract's rule 4).
package snapstore
