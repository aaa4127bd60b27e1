package metrics

import (
	"context"
	"fmt"
	"io"
	"net/http"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families is one scrape: metric families by name.
type Families map[string]*dto.MetricFamily

// Scrape reads url (a /metrics endpoint) in the text exposition format.
func Scrape(ctx context.Context, url string) (Families, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("metrics: GET %s: %s: %s", url, resp.Status, b)
	}
	return Parse(resp.Body)
}

// Parse reads families in the text exposition format.
func Parse(r io.Reader) (Families, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fs, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("metrics: parse: %w", err)
	}
	return Families(fs), nil
}

// Gather reads s's families directly, without HTTP.
func (s *Set) Gather() (Families, error) {
	if s == nil {
		return Families{}, nil
	}
	fs, err := s.reg.Gather()
	if err != nil {
		return nil, err
	}
	out := Families{}
	for _, f := range fs {
		out[f.GetName()] = f
	}
	return out, nil
}

// Series counts the series of family name (0 when it is absent).
func (f Families) Series(name string) int {
	if fam, ok := f[name]; ok {
		return len(fam.GetMetric())
	}
	return 0
}

// Sum adds up, over the series of family name whose labels include every
// pair of match, a counter's or gauge's value or a histogram's sample
// count.
func (f Families) Sum(name string, match map[string]string) float64 {
	fam, ok := f[name]
	if !ok {
		return 0
	}
	var sum float64
next:
	for _, m := range fam.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range match {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum
}
