package netns

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Proxy is a TCP proxy from a listen address to an upstream that can delay
// the data it carries: latency and jitter in user space, where the kernel
// has no netem. It is Toxiproxy's proxy used as a library (see the package
// doc for why), running in this process and its network namespace.
type Proxy struct {
	mu sync.Mutex
	p  *toxiproxy.Proxy
}

// NewProxy starts a proxy that listens on listen (host:port; port 0 picks
// a free one, Addr says which) and forwards each connection to upstream,
// with no delay until SetLatency. Close stops it.
func NewProxy(listen, upstream string) (*Proxy, error) {
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(server, "netns", listen, upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("netns: proxy %s to %s: %w", listen, upstream, err)
	}
	return &Proxy{p: p}, nil
}

// Addr returns the address the proxy listens on.
func (p *Proxy) Addr() string {
	p.p.Lock()
	defer p.p.Unlock()
	return p.p.Listen
}

// SetLatency delays every chunk of data through the proxy, each way, by
// latency give or take up to jitter (uniformly, in whole milliseconds), in
// place of the delay set before; a connection's data keeps its order. A
// round trip through the proxy so takes at least 2*(latency-jitter) more.
// jitter must not exceed latency.
func (p *Proxy) SetLatency(latency, jitter time.Duration) error {
	if latency < 0 || jitter < 0 || jitter > latency {
		return fmt.Errorf("netns: proxy %s: latency %s, jitter %s: want 0 <= jitter <= latency", p.Addr(), latency, jitter)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.p.Toxics.ResetToxics(context.Background())
	if latency == 0 {
		return nil
	}
	for _, stream := range []string{"upstream", "downstream"} {
		spec := fmt.Sprintf(`{"name":"latency_%s","type":"latency","stream":%q,"toxicity":1,"attributes":{"latency":%d,"jitter":%d}}`,
			stream, stream, latency.Milliseconds(), jitter.Milliseconds())
		if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(spec)); err != nil {
			return fmt.Errorf("netns: proxy %s: latency %s: %w", p.Addr(), stream, err)
		}
	}
	return nil
}

// Reset ends the delay: data goes through as it comes.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.p.Toxics.ResetToxics(context.Background())
}

// Close stops the proxy: it stops listening and closes the connections it
// carries. It may be called more than once.
func (p *Proxy) Close() error {
	p.p.Stop()
	return nil
}
