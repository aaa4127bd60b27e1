package relay

import "errors"

// ErrStaleGeneration is returned (wrapped, naming both generations) by
// Repoint for a generation that is not higher than the relay's.
var ErrStaleGeneration = errors.New("relay: stale generation")

// ErrBadUpstream is returned (wrapped) by Repoint and New for an upstream
// that is not an absolute http or https URL without query or fragment.
var ErrBadUpstream = errors.New("relay: bad upstream URL")

// ErrTransition is returned (wrapped, naming both states) for a call state
// change the table does not list; it means a bug in the relay.
var ErrTransition = errors.New("relay: illegal call transition")

// ErrUnknownEdit is returned (wrapped, naming the unknown names and the
// known ones) by LookupEdits and Label for an edit no file registered.
var ErrUnknownEdit = errors.New("relay: unknown relay edit")
