package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/live"
)

// request calls endpoint of the bridge service with in as its JSON body
// and decodes the answer into out. An error answer (micro's error headers)
// is an *Error: its status from the code header, its code and detail from
// the JSON body the bridge sends, else from the description header.
func (c *Client) request(ctx context.Context, endpoint string, in, out any) error {
	subject := c.subject + "." + endpoint
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	msg, err := c.nc.RequestWithContext(ctx, subject, body)
	if err != nil {
		return fmt.Errorf("client: %s: %w", subject, err)
	}
	if code := msg.Header.Get(micro.ErrorCodeHeader); code != "" {
		status, _ := strconv.Atoi(code)
		var e struct {
			Error bridgeapi.APIError `json:"error"`
		}
		if json.Unmarshal(msg.Data, &e) == nil && e.Error.Code != "" {
			return &Error{Status: status, Code: e.Error.Code, Detail: e.Error.Detail}
		}
		res := &Error{Status: status, Code: "service_error", Detail: msg.Header.Get(micro.ErrorHeader)}
		if k, rest, ok := strings.Cut(res.Detail, ": "); ok {
			res.Code, res.Detail = k, rest
		}
		return res
	}
	if err := json.Unmarshal(msg.Data, out); err != nil {
		return fmt.Errorf("client: %s: the answer does not decode: %w", subject, err)
	}
	return nil
}

// readyNATS waits until the service answers its status endpoint, asking
// again (live.Retry) while it does not: no responders (the bridge not
// serving yet) is waited out, like any other failure to answer. An error
// answer is an answer.
func (c *Client) readyNATS(ctx context.Context) error {
	answered := func(err error) bool {
		var ae *Error
		return err == nil || errors.As(err, &ae)
	}
	_, err := live.Retry(ctx, live.Policy{Interval: poll.Every(50 * time.Millisecond), Again: func(err error) bool { return !answered(err) }},
		func(ctx context.Context) (bridgeapi.Status, error) {
			var st bridgeapi.Status
			return st, c.request(ctx, bridgeapi.EndpointStatus, struct{}{}, &st)
		})
	if !answered(err) {
		return fmt.Errorf("client: bridge service %s not ready: %w", c.subject, ctx.Err())
	}
	return nil
}
