// Package providertest is the sandbox providers' contract suite: Run
// checks a provider against the rules of package provider (ids and paths
// refused before anything is made, files and Exec, snapshots and forks
// independent, failures that leave nothing), and each provider's own
// TestContract runs it. It also holds the helpers the providers' tests
// and benchmarks share.
package providertest
