package owner

import (
	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
)

// The names below forward to package ownerapi, where the owner's wire
// types and client live. They stay only until the agent declares the owner
// it calls against ownerapi (participants/agent/owner.go); new code uses
// ownerapi directly.
type (
	// SeedRequest is ownerapi.SeedRequest.
	SeedRequest = ownerapi.SeedRequest
	// SessionInfo is ownerapi.SessionInfo.
	SessionInfo = ownerapi.SessionInfo
	// VerifyRequest is ownerapi.VerifyRequest.
	VerifyRequest = ownerapi.VerifyRequest
	// VerifyResult is ownerapi.VerifyResult.
	VerifyResult = ownerapi.VerifyResult
	// Client is ownerapi.Client.
	Client = ownerapi.Client
)

// NewClient is ownerapi.NewClient.
func NewClient(nc *nats.Conn, run, name string) (*Client, error) {
	return ownerapi.NewClient(nc, run, name)
}
