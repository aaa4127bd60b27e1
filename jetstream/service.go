package jetstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// Request-reply services (the sandbox daemon's and the owner's, for
// agents) are NATS micro services with JSON bodies, on subjects under
// spsvc., outside the audit stream.

// MaxRequestBody bounds a service request.
const MaxRequestBody = 1 << 20

// ErrBadRequest is wrapped by DecodeRequest for a body that is not the
// JSON object expected.
var ErrBadRequest = errors.New("jetstream: bad request")

// ServiceError is the error a service endpoint answers with: an HTTP-like
// status (400, 404, 409, 422, 500), a snake_case code and a detail.
type ServiceError struct {
	Status int
	Code   string
	Detail string
}

// Error implements error.
func (e *ServiceError) Error() string {
	return fmt.Sprintf("%s (%d): %s", e.Code, e.Status, e.Detail)
}

// Classify maps a handler's error to a status and a code.
type Classify func(error) (status int, code string)

// Service is a group of JSON endpoints under one subject prefix. Each
// endpoint serves its requests in turn on its own goroutine (micro reads a
// request's state after its handler returns, so a handler must answer
// before it returns); Stop lets the handlers in flight answer, then stops
// the service.
type Service struct {
	nc       *nats.Conn
	svc      micro.Service
	group    micro.Group
	classify Classify
	errBody  ErrorBody // nil: error answers have no body

	mu      sync.Mutex
	closing bool
	cancels []context.CancelFunc
	wg      sync.WaitGroup
}

// ErrorBody makes the body of an error answer from its status, code and
// error: a service whose callers read errors as JSON (the bridge's) sets
// one with SetErrorBody.
type ErrorBody func(status int, code string, err error) []byte

// NewService adds a micro service named cfg.Name whose endpoints live
// under prefix.
func NewService(nc *nats.Conn, cfg micro.Config, prefix string, classify Classify) (*Service, error) {
	svc, err := micro.AddService(nc, cfg)
	if err != nil {
		return nil, fmt.Errorf("jetstream: service %s: %w", cfg.Name, err)
	}
	return &Service{nc: nc, svc: svc, classify: classify, group: svc.AddGroup(prefix, micro.WithGroupQueueGroupDisabled())}, nil
}

// SetErrorBody makes every error answer carry body(status, code, err) as
// its body, beside micro's error headers. Call it before adding endpoints.
func (s *Service) SetErrorBody(body ErrorBody) { s.errBody = body }

// errorAnswer is an error's micro headers (the status, and "code: detail"
// on one line: a header value cannot hold a line break, which a joined
// error has) and its body, if the service has one.
func (s *Service) errorAnswer(err error) (status, desc string, body []byte) {
	st, code := s.classify(err)
	if s.errBody != nil {
		body = s.errBody(st, code, err)
	}
	return strconv.Itoa(st), code + ": " + oneLine(err.Error()), body
}

// oneLine joins the lines of s with "; ".
func oneLine(s string) string {
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' }), "; ")
}

// Handle adds endpoint name: fn gets the request body and returns the
// answer, marshalled as JSON, or an error, answered as a ServiceError.
func (s *Service) Handle(name string, fn func(body []byte) (any, error)) error {
	return s.group.AddEndpoint(name, micro.HandlerFunc(func(req micro.Request) {
		if !s.admit() {
			return
		}
		defer s.wg.Done()
		// micro reads the request's state once the handler returns, so the
		// answer is given here, on the endpoint's own goroutine: requests to
		// one endpoint are served in turn, endpoints side by side.
		res, err := fn(req.Data())
		if err != nil {
			status, desc, body := s.errorAnswer(err)
			_ = req.Error(status, desc, body)
			return
		}
		if err := req.RespondJSON(res); err != nil {
			// Not sent (over the max payload, say): say so rather than let
			// the caller wait for nothing.
			_ = req.Error("500", "internal: "+oneLine(err.Error()), nil)
		}
	}))
}

// HandleAsync adds endpoint name whose requests are served side by side,
// each on its own goroutine, for requests that take long (a rollout).
// micro sees such a request as answered at once; the answer is published
// to its reply subject by hand, with micro's error headers. fn's ctx ends
// with ctx or when Stop is called; Stop waits for fn.
func (s *Service) HandleAsync(ctx context.Context, name string, fn func(ctx context.Context, body []byte) (any, error)) error {
	ctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	s.cancels = append(s.cancels, cancel)
	s.mu.Unlock()
	return s.group.AddEndpoint(name, micro.HandlerFunc(func(req micro.Request) {
		if !s.admit() {
			return
		}
		body := bytes.Clone(req.Data())
		reply := req.Reply()
		go func() {
			defer s.wg.Done()
			res, err := fn(ctx, body)
			if reply == "" {
				return
			}
			m := nats.NewMsg(reply)
			if err != nil {
				status, desc, body := s.errorAnswer(err)
				m.Header.Set(micro.ErrorCodeHeader, status)
				m.Header.Set(micro.ErrorHeader, desc)
				m.Data = body
			} else if m.Data, err = json.Marshal(res); err != nil {
				m.Header.Set(micro.ErrorCodeHeader, "500")
				m.Header.Set(micro.ErrorHeader, "internal: "+oneLine(err.Error()))
			} else if max := s.nc.MaxPayload(); max > 0 && int64(len(m.Data)) > max-1024 {
				// The server would refuse it, and the caller wait for nothing.
				m.Data = nil
				m.Header.Set(micro.ErrorCodeHeader, "500")
				m.Header.Set(micro.ErrorHeader, fmt.Sprintf("internal: the answer is over the server's max payload (%d bytes)", max))
			}
			_ = s.nc.PublishMsg(m)
		}()
	}))
}

// admit counts a request in (Stop waits for it), unless the service is
// stopping; the caller calls s.wg.Done when it answered.
func (s *Service) admit() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.wg.Add(1)
	return true
}

// Stop waits for the handlers in flight, then stops the service.
func (s *Service) Stop() error {
	s.mu.Lock()
	s.closing = true
	for _, c := range s.cancels {
		c()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return s.svc.Stop()
}

// DecodeRequest decodes a request body strictly: one JSON object, no
// unknown field, at most MaxRequestBody bytes; the error wraps
// ErrBadRequest and names what is wrong.
func DecodeRequest(body []byte, v any) error {
	if len(body) > MaxRequestBody {
		return fmt.Errorf("%w: body over %d bytes", ErrBadRequest, MaxRequestBody)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	return nil
}

// ServiceClient calls the endpoints of one service, the subjects below a
// prefix.
type ServiceClient struct {
	nc     *nats.Conn
	prefix string
}

// NewServiceClient returns a client of the service under prefix.
func NewServiceClient(nc *nats.Conn, prefix string) *ServiceClient {
	return &ServiceClient{nc: nc, prefix: prefix}
}

// Call calls endpoint as Call does.
func (c *ServiceClient) Call(ctx context.Context, endpoint string, in, out any) error {
	return Call(ctx, c.nc, c.prefix+"."+endpoint, in, out)
}

// Call sends in as JSON to subject and decodes the answer into out; an
// error answer comes back as a *ServiceError.
func Call(ctx context.Context, nc *nats.Conn, subject string, in, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	msg, err := nc.RequestWithContext(ctx, subject, b)
	if err != nil {
		return fmt.Errorf("%s: %w", subject, err)
	}
	if code := msg.Header.Get(micro.ErrorCodeHeader); code != "" {
		status, _ := strconv.Atoi(code)
		se := &ServiceError{Status: status, Detail: msg.Header.Get(micro.ErrorHeader)}
		if k, rest, ok := strings.Cut(se.Detail, ": "); ok {
			se.Code, se.Detail = k, rest
		}
		return se
	}
	if err := json.Unmarshal(msg.Data, out); err != nil {
		return fmt.Errorf("%s: the answer does not decode: %w", subject, err)
	}
	return nil
}
