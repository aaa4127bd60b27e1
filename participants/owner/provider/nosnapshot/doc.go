// Package nosnapshot is the nosnapshot sandbox provider: it wraps another
// provider and cannot snapshot, standing in for the providers that cannot
// (docker, apptainer, enroot), so that tests drive the owner's
// restart_only mode (PROTOCOL §6). It needs no system of its own, and
// keeps the contract of package provider with Caps().Snapshot false.
package nosnapshot
