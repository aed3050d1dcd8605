// Package envoyrls serves Envoy's rate limit service protocol
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) over gRPC,
// on the same check path as the daemon's socket and HTTP faces
// (policy.Policy.CheckTo). It is the only package of rld that imports gRPC
// and Envoy's generated types.
//
// A request's domain and each of its descriptors become rld descriptors
// (see mapDescriptor and docs/envoy.md); each descriptor is one check, and
// its decision one status of the response. Import converts an
// envoyproxy/ratelimit YAML configuration into rld rules that select the
// same limits.
package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rld/rld/header"
	"github.com/rld/rld/policy"
)

// Options configure a Server.
type Options struct {
	// Policy returns the policy in force (a reload swaps it). Required.
	Policy func() *policy.Policy
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Server answers ShouldRateLimit. It is safe for concurrent use.
type Server struct {
	pb.UnimplementedRateLimitServiceServer
	policy  func() *policy.Policy
	now     func() time.Time
	grpc    *grpc.Server
	scratch sync.Pool // *scratch
}

// scratch holds one call's reusable buffers.
type scratch struct {
	m      mapper
	sc     policy.Scratch
	dec    policy.Decision
	fields []header.Field // the response's header fields
	hbuf   []byte         // their values
}

// New returns a Server with its gRPC server built; Serve starts it.
func New(opts Options) (*Server, error) {
	if opts.Policy == nil {
		return nil, errors.New("envoyrls: Options.Policy is required")
	}
	s := &Server{policy: opts.Policy, now: opts.Now}
	if s.now == nil {
		s.now = time.Now
	}
	s.scratch.New = func() any { return new(scratch) }
	s.grpc = grpc.NewServer()
	pb.RegisterRateLimitServiceServer(s.grpc, s)
	return s, nil
}

// Serve answers on ln until Stop or GracefulStop; it returns nil when
// stopped that way.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.grpc.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("envoy rls on %s: %w", ln.Addr(), err)
	}
	return nil
}

// Drain stops accepting calls, lets the calls in flight finish, and
// closes what is left when ctx ends first. It closes the listeners.
func (s *Server) Drain(ctx context.Context) {
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
	}
}

// ShouldRateLimit decides each descriptor of req as one check of the
// policy in force, taking hits_addend units (the descriptor's when set,
// else the request's; 0 means 1). The overall code is OVER_LIMIT when any
// descriptor's is. A request that cannot be mapped gets InvalidArgument
// and takes nothing; a store failure that no rule's fail mode decides
// gets Unavailable (Envoy's failure_mode_deny then decides).
func (s *Server) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	scr := s.scratch.Get().(*scratch)
	defer s.scratch.Put(scr)
	if err := validate(req, &scr.m); err != nil {
		requestsInvalid.Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	p := s.policy()
	now := s.now()
	resp := &pb.RateLimitResponse{
		OverallCode: pb.RateLimitResponse_OK,
		Statuses:    make([]*pb.RateLimitResponse_DescriptorStatus, len(req.Descriptors)),
	}
	var hdr headerPick
	for i, d := range req.Descriptors {
		if err := scr.m.mapDescriptor(req.Domain, d); err != nil {
			// validate checked every descriptor: unreachable.
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		p.CheckTo(ctx, &policy.Request{Now: now, Descs: scr.m.descs, Cost: cost(req, d)}, &scr.sc, &scr.dec)
		st, err := descriptorStatus(&scr.dec)
		if err != nil {
			requestsError.Inc()
			return nil, status.Error(codes.Unavailable, fmt.Sprintf("descriptor %d: %v", i, err))
		}
		resp.Statuses[i] = st
		if st.Code == pb.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = pb.RateLimitResponse_OVER_LIMIT
		}
		hdr.consider(&scr.dec)
	}
	resp.ResponseHeadersToAdd = hdr.headers(now, scr)
	if resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT {
		requestsOverLimit.Inc()
	} else {
		requestsOK.Inc()
	}
	return resp, nil
}

// validate checks what mapDescriptor would refuse, for every descriptor,
// before any is checked: a bad request takes nothing. It maps with m.
func validate(req *pb.RateLimitRequest, m *mapper) error {
	if req.GetDomain() == "" {
		return errors.New("domain must not be empty")
	}
	if len(req.GetDescriptors()) == 0 {
		return errors.New("descriptor list must not be empty")
	}
	for i, d := range req.Descriptors {
		if d.GetIsNegativeHits() {
			return fmt.Errorf("descriptor %d: is_negative_hits is not supported: a request cannot give quota back", i)
		}
		if err := m.mapDescriptor(req.Domain, d); err != nil {
			return fmt.Errorf("descriptor %d: %w", i, err)
		}
	}
	return nil
}

// cost returns the units descriptor d takes: its hits_addend when set,
// else the request's; 0 means 1 (policy's default). A count beyond int64
// is clamped: no limit admits it.
func cost(req *pb.RateLimitRequest, d *rlv3.RateLimitDescriptor) int64 {
	n := uint64(req.GetHitsAddend())
	if h := d.GetHitsAddend(); h != nil {
		n = h.GetValue()
	}
	return int64(min(n, math.MaxInt64))
}
