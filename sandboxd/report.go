package sandboxd

// MaxReportPIDs is how many pids a pause or continue lists: in a
// sandboxapi.PauseResult, and in the events.PauseReport a daemon's ack
// carries.
const MaxReportPIDs = 16
