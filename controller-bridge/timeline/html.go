package timeline

import (
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"time"
)

//go:embed page.html.tmpl
var pageSource string

var page = template.Must(template.New("timeline").Parse(pageSource))

// Page is what the HTML page shows: a title, when it was made, and the
// operations.
type Page struct {
	// Run is the run id.
	Run string `json:"run"`
	// Generated is when the page was written.
	Generated time.Time `json:"generated"`
	Ops       []Op      `json:"ops"`
}

// WriteHTML writes p as one self-contained page: inline CSS and script,
// the model embedded as JSON, no request to any server. Its script draws,
// per operation, a Gantt-style SVG: one row per member (each a <g
// class="member-row" data-member=...>), a bar per phase from the phase's
// publish to that member's ack, failures and missing acks marked, the
// numbers in each bar's title.
func WriteHTML(w io.Writer, p Page) error {
	if p.Ops == nil {
		p.Ops = []Op{}
	}
	if err := page.Execute(w, p); err != nil {
		return fmt.Errorf("timeline: html: %w", err)
	}
	return nil
}
