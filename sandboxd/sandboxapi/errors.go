package sandboxapi

import "errors"

// ErrUnknownMode is returned (wrapped, naming the mode) by ParseMode and
// Mode.UnmarshalText for a name that is not a pause mode. A daemon answers
// it with CodeModeUnavailable.
var ErrUnknownMode = errors.New("sandboxapi: unknown pause mode")
