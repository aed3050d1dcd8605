package envoyrls

import (
	"context"
	"fmt"
	"strings"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Client calls ShouldRateLimit, as Envoy does, for tests, benchmarks and
// tools that should not import gRPC themselves. It is safe for concurrent
// use.
type Client struct {
	conn *grpc.ClientConn
	rls  pb.RateLimitServiceClient
}

// Entry is one key/value entry of an Envoy descriptor.
type Entry struct{ Key, Value string }

// Status is one descriptor's status in a Response.
type Status struct {
	Code      string // "OK", "OVER_LIMIT" or "UNKNOWN"
	Limit     uint32 // current_limit.requests_per_unit; 0 when none
	Unit      string // current_limit.unit ("MINUTE"); "" when none
	Remaining uint32
	Reset     time.Duration // duration_until_reset
}

// Response is a ShouldRateLimit answer.
type Response struct {
	Code     string // the overall code
	Statuses []Status
	Headers  map[string]string // response_headers_to_add
}

// Dial connects to addr: host:port, or unix:PATH for a Unix socket.
func Dial(addr string) (*Client, error) {
	target := addr
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		target = "unix://" + p
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("envoyrls: dial %s: %w", addr, err)
	}
	return &Client{conn: conn, rls: pb.NewRateLimitServiceClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Check asks whether the descriptors (each a list of entries) of domain
// may pass, taking hits units (0 means 1).
func (c *Client) Check(ctx context.Context, domain string, descs [][]Entry, hits uint32) (Response, error) {
	req := &pb.RateLimitRequest{Domain: domain, HitsAddend: hits}
	for _, d := range descs {
		rd := &rlv3.RateLimitDescriptor{}
		for _, e := range d {
			rd.Entries = append(rd.Entries, &rlv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
		}
		req.Descriptors = append(req.Descriptors, rd)
	}
	resp, err := c.rls.ShouldRateLimit(ctx, req)
	if err != nil {
		return Response{}, err
	}
	out := Response{Code: resp.GetOverallCode().String(), Headers: map[string]string{}}
	for _, s := range resp.GetStatuses() {
		st := Status{Code: s.GetCode().String(), Remaining: s.GetLimitRemaining(), Reset: s.GetDurationUntilReset().AsDuration()}
		if l := s.GetCurrentLimit(); l != nil {
			st.Limit, st.Unit = l.GetRequestsPerUnit(), l.GetUnit().String()
		}
		out.Statuses = append(out.Statuses, st)
	}
	for _, h := range resp.GetResponseHeadersToAdd() {
		out.Headers[h.GetKey()] = h.GetValue()
	}
	return out, nil
}
