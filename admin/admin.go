// Package admin is rld's admin API: the operations an operator runs on a
// live daemon, as plain Go values with JSON tags, and the one dispatcher
// that the three faces — ADMIN frames on the socket, the admin HTTP API
// and `rld admin` — call.
//
// The daemon implements Service. A face authenticates its caller (peer uid
// on the socket, bearer token on HTTP), then hands the request to
// Server.Serve, which decodes it, looks its op up in the table of ops,
// checks the arguments and calls the Service. Adding an operation means a
// method on Service, its argument and result types, and one entry in ops.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/rld/rld/descriptor"
)

// Service is what the daemon provides to the admin faces. Implementations
// are safe for concurrent use. A method returns an *Error for a request
// it refuses (bad arguments, unknown rule); any other error is internal.
type Service interface {
	// Explain lists the rules that match a set of descriptors, with their
	// counter keys, limits and what a check would get now, consuming
	// nothing.
	Explain(ctx context.Context, args ExplainArgs) (ExplainResult, error)
	// Top lists the most denied keys of each rule: of the fleet on
	// Redis (the daemons' published reports merged), or of this daemon
	// since it started (args.Local, or without Redis).
	Top(ctx context.Context, args TopArgs) (TopResult, error)
	// Config describes the configuration in force.
	Config(ctx context.Context) (ConfigResult, error)
}

// Request is one admin request: an op name and its arguments, as an ADMIN
// frame's body and the CLI carry it ({"op":"explain","args":{...}}).
type Request struct {
	Op   string          `json:"op"`
	Args json.RawMessage `json:"args,omitempty"`
}

// Descriptor is one name=value pair of a request to explain.
type Descriptor struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// ExplainArgs are explain's arguments.
type ExplainArgs struct {
	Descriptors Descriptors `json:"descriptors"`
	// Cost is the units a check would take; 0 means 1.
	Cost int64 `json:"cost,omitempty"`
}

// ExplainResult is explain's answer.
type ExplainResult struct {
	// List is "deny" or "allow" when the descriptors match the deny or
	// allow list (or a descriptor block), which decide before any rule;
	// "" otherwise.
	List string `json:"list,omitempty"`
	// Decision is the answer a check of the descriptors would get now.
	Decision ExplainDecision `json:"decision"`
	// Rules are the rules whose match holds, in evaluation order.
	Rules []RuleMatch `json:"rules"`
}

// ExplainDecision is the answer a check would get, in the terms of a
// check's answer (docs/protocol.md): its numbers are rendered by the code
// that renders a check's.
type ExplainDecision struct {
	// Status is "allowed", "limited", "blocked" or "error".
	Status string `json:"status"`
	// Code is the error's code when Status is "error", such as
	// "cost_too_large".
	Code string `json:"code,omitempty"`
	// Rule is the deciding rule: a rule's name, "deny" or "allow" (the
	// lists), or "" when no rule applies (as in a check's answer).
	Rule    string `json:"rule"`
	Allowed bool   `json:"allowed"`
	// Limit, Remaining and ResetMs are the deciding limit's numbers, as
	// a check's answer gives them (zero when no rule decided by a limit).
	Limit     uint64 `json:"limit"`
	Remaining uint64 `json:"remaining"`
	ResetMs   int64  `json:"reset_ms"`
	// RetryAfterMs is when to retry a limited check (at least 1). A
	// rule's penalty or retry_jitter may lengthen a real refusal's.
	RetryAfterMs int64 `json:"retry_after_ms,omitempty"`
	// Message says what failed when Status is "error".
	Message string `json:"message,omitempty"`
}

// RuleMatch is one rule that matches the descriptors.
type RuleMatch struct {
	Rule string `json:"rule"`
	// Key is the counter key: the rule's by descriptors as name=value,
	// joined by ",".
	Key string `json:"key,omitempty"`
	// Missing names a by descriptor the request lacks: the rule does not
	// apply to the request (it neither counts nor refuses it), and
	// Status, Allowed, Remaining and ResetMs are absent.
	Missing   string `json:"missing,omitempty"`
	Tier      string `json:"tier,omitempty"`
	Algorithm string `json:"algorithm"`
	// Limit is the limit in force, with Period and Burst.
	Limit  int64  `json:"limit"`
	Period string `json:"period"`
	Burst  int64  `json:"burst,omitempty"`
	Mode   string `json:"mode"`
	Fail   string `json:"fail"`
	Shadow bool   `json:"shadow,omitempty"`
	// Enforce is the share of the rule's keys that it enforces, such as
	// "25%" or "100%"; Enforced reports whether it enforces this key
	// (false for a shadow rule, a key outside the share, or a missing
	// by descriptor): a key it does not enforce is counted, never refused.
	Enforce  string `json:"enforce"`
	Enforced bool   `json:"enforced"`
	// Status is what this rule says on its own: "allowed", "limited",
	// "blocked" or "error" (Code "cost_too_large" when the cost exceeds
	// the limit's capacity, "internal" when its store failed); "" when
	// the rule does not apply (Missing).
	Status string `json:"status,omitempty"`
	Code   string `json:"code,omitempty"`
	// Overridden is set when an override sets Limit; Blocked when a
	// block of the key is in force; Cooldown when the key is in the
	// rule's penalty cooldown (refused until it ends).
	Overridden bool `json:"overridden,omitempty"`
	Blocked    bool `json:"blocked,omitempty"`
	Cooldown   bool `json:"cooldown,omitempty"`
	// Allowed, Remaining and ResetMs are what a check of this cost would
	// get from the rule now; absent when the rule does not apply.
	Allowed   *bool  `json:"allowed,omitempty"`
	Remaining *int64 `json:"remaining,omitempty"`
	ResetMs   *int64 `json:"reset_ms,omitempty"`
	// RetryAfterMs is when a check of this cost would be admitted, if it
	// is limited now.
	RetryAfterMs int64 `json:"retry_after_ms,omitempty"`
	// Error is the store's error when it could not be read.
	Error string `json:"error,omitempty"`
	// Region is, for a rule with scope = "global", this region's share
	// of the key's limit.
	Region *RegionShare `json:"region,omitempty"`
}

// RegionShare is a region's share of a global rule's limit for one key.
type RegionShare struct {
	Region string `json:"region"`
	// Share is the units of Limit the region decides with now: its
	// lease's while Live, else its fallback share.
	Share int64 `json:"share"`
	Limit int64 `json:"limit"`
	Live  bool  `json:"live"`
	// ExpiresMs is how long the lease holds still (negative: expired
	// that long ago); absent when the region never held one.
	ExpiresMs *int64 `json:"expires_ms,omitempty"`
	Fallback  int64  `json:"fallback"`
	// Demand is the region's demand of the key at its last renewal, in
	// units per period.
	Demand int64 `json:"demand"`
	// Strict reports a global_strict rule: without a live lease, the
	// key's next check asks the global store for a share.
	Strict bool `json:"strict,omitempty"`
}

// TopArgs are top's arguments.
type TopArgs struct {
	// Rule restricts the answer to one rule; "" lists every rule that
	// denied.
	Rule string `json:"rule,omitempty"`
	// N is the most keys listed per rule; 0 means DefaultTopN.
	N int `json:"n,omitempty"`
	// Local asks for this daemon's denials only, not the fleet's.
	Local Flag `json:"local,omitempty"`
}

// Flag is a JSON boolean that also reads "true"/"false" and 1/0, as a
// GET's query gives it (?local=true, ?local=1).
type Flag bool

// UnmarshalJSON implements json.Unmarshaler.
func (f *Flag) UnmarshalJSON(b []byte) error {
	switch strings.Trim(string(b), `"`) {
	case "true", "1":
		*f = true
	case "false", "0":
		*f = false
	default:
		return fmt.Errorf("%s is not a boolean: give true or false", b)
	}
	return nil
}

// DefaultTopN is how many keys top lists per rule by default.
const DefaultTopN = 10

// TopResult is top's answer.
type TopResult struct {
	Rules []RuleTop `json:"rules"`
	// Daemons are the daemons whose denials it counts: this one, and on
	// Redis every other that published its report recently, with the
	// report's age.
	Daemons []DaemonSeen `json:"daemons"`
	// Fleet reports that it merges the fleet's reports; false for one
	// daemon's view (asked for, without Redis, or Redis failing).
	Fleet bool `json:"fleet"`
	// Warning says why a fleet view was asked for and not given.
	Warning string `json:"warning,omitempty"`
}

// DaemonSeen is one daemon a top answer counts.
type DaemonSeen struct {
	Daemon string `json:"daemon"`
	// AgeMs is how old its report is (0 for the daemon answering).
	AgeMs int64 `json:"age_ms"`
	// Self marks the daemon answering.
	Self bool `json:"self,omitempty"`
}

// RuleTop is the most denied keys of one rule.
type RuleTop struct {
	Rule string `json:"rule"`
	// Denied is how many denials the rule's sketch has counted.
	Denied uint64     `json:"denied"`
	Keys   []KeyCount `json:"keys"`
}

// KeyCount is one denied key: it was denied at least Count−Error and at
// most Count times.
type KeyCount struct {
	Key   string `json:"key"`
	Count uint64 `json:"count"`
	Error uint64 `json:"error"`
	// By is each daemon's part of Count, most first: the daemons that
	// denied the key.
	By []DaemonCount `json:"by,omitempty"`
}

// DaemonCount is one daemon's denials of a key.
type DaemonCount struct {
	Daemon string `json:"daemon"`
	Count  uint64 `json:"count"`
}

// ConfigResult is config's answer.
type ConfigResult struct {
	// Hash is the first 16 hex digits of the SHA-256 of the file's bytes.
	Hash     string    `json:"hash"`
	Path     string    `json:"path"`
	LoadedAt time.Time `json:"loaded_at"`
	Rules    []string  `json:"rules"`
}

// Code classifies a refused admin request.
type Code string

// Codes.
const (
	// CodeBadRequest: the request or its arguments are invalid.
	CodeBadRequest Code = "bad_request"
	// CodeUnknownOp: no such operation.
	CodeUnknownOp Code = "unknown_op"
	// CodeNotFound: the request names something that does not exist
	// (a rule).
	CodeNotFound Code = "not_found"
	// CodeForbidden: the caller may not use the admin API.
	CodeForbidden Code = "forbidden"
	// CodeUnauthorized: the caller did not authenticate (admin HTTP
	// without a bearer token).
	CodeUnauthorized Code = "unauthorized"
	// CodeMethodNotAllowed: an admin HTTP request whose method the op
	// does not take (GET of an op that changes state); the answer's
	// Allow header names the method to use.
	CodeMethodNotAllowed Code = "method_not_allowed"
	// CodeInternal: the daemon failed.
	CodeInternal Code = "internal"
)

// Error is a refused or failed admin request.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Errorf returns an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Response is the answer to one admin request: Result on success, else
// Err.
type Response struct {
	Result json.RawMessage `json:"result,omitempty"`
	Err    *Error          `json:"error,omitempty"`
}

// Payload returns the response as a face sends it: the result's JSON, or
// {"error":{"code":…,"message":…}}.
func (r Response) Payload() []byte {
	if r.Err == nil {
		return r.Result
	}
	b, _ := json.Marshal(struct {
		Err *Error `json:"error"`
	}{r.Err})
	return b
}

// ParsePayload reads a payload that Payload wrote: ok tells a result
// from an error.
func ParsePayload(b []byte, ok bool) Response {
	if ok {
		return Response{Result: b}
	}
	var e struct {
		Err *Error `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil || e.Err == nil {
		return Response{Err: Errorf(CodeInternal, "unreadable error payload %q", b)}
	}
	return Response{Err: e.Err}
}

// Caller says who sent an admin request, for authorisation and the logs.
type Caller struct {
	// Face is "socket" or "http".
	Face string
	// UID is the socket peer's uid; -1 when unknown or on HTTP.
	UID int
	// Addr is the HTTP peer's address.
	Addr string
	// Token is set when the HTTP peer presented a valid token.
	Token bool
	// Role is what the face authorised the caller to do; the zero Role
	// may run nothing.
	Role Role
}

// Role is what an authorised admin caller may do.
type Role uint8

// Roles.
const (
	// RoleNone may run no op.
	RoleNone Role = iota
	// RoleRead may run the ops that change nothing (explain, top, list,
	// config): admin.read_token_file, admin.read_socket_uids.
	RoleRead
	// RoleWrite may run every op: admin.token_file, admin.socket_uids.
	RoleWrite
)

// String returns "read", "write" or "none".
func (r Role) String() string {
	switch r {
	case RoleRead:
		return "read"
	case RoleWrite:
		return "write"
	}
	return "none"
}

// Allows reports whether r may run op.
func (r Role) Allows(op Op) bool {
	return r == RoleWrite || (r == RoleRead && !op.Changes)
}

// String describes the caller for a log line: "uid=0" or
// "http 127.0.0.1:5000 (token)".
func (c Caller) String() string {
	if c.Face == "http" {
		if c.Token {
			return "http " + c.Addr + " (" + c.Role.String() + " token)"
		}
		return "http " + c.Addr + " (no valid token)"
	}
	if c.UID < 0 {
		return "uid=unknown"
	}
	return "uid=" + strconv.Itoa(c.UID)
}

// LogValue makes a Caller a slog attribute value.
func (c Caller) LogValue() slog.Value { return slog.StringValue(c.String()) }

// Op is one entry of the table of admin operations.
type Op struct {
	// Name is the op's name in requests, URLs and the CLI.
	Name string
	// Changes is set for an op that changes the daemon's state: each
	// one is logged with its caller, in the daemon's log and the
	// decision log, whether it succeeds or not.
	Changes bool
	// Help is a one-line description.
	Help string
	call func(ctx context.Context, s Service, args json.RawMessage) (any, error)
}

// ops is the table of admin operations, in the order `rld admin` lists
// them. The operations that change counting join it as entries with
// Changes set, each group from its own file (state.go: reset, grant;
// changes.go: overrides and blocks).
var ops = []Op{
	{Name: "explain", Help: "the answer a check of descriptors would get, and each rule that matches: key, limit, what it says; consumes nothing",
		call: func(ctx context.Context, s Service, raw json.RawMessage) (any, error) {
			var a ExplainArgs
			if err := decodeArgs(raw, &a); err != nil {
				return nil, err
			}
			if err := a.validate(); err != nil {
				return nil, err
			}
			return s.Explain(ctx, a)
		}},
	{Name: "top", Help: "the most denied keys of each rule",
		call: func(ctx context.Context, s Service, raw json.RawMessage) (any, error) {
			var a TopArgs
			if err := decodeArgs(raw, &a); err != nil {
				return nil, err
			}
			if a.N < 0 {
				return nil, Errorf(CodeBadRequest, "n = %d: must not be negative", a.N)
			}
			if a.N == 0 {
				a.N = DefaultTopN
			}
			return s.Top(ctx, a)
		}},
	{Name: "config", Help: "the configuration in force: its hash, path, load time and rules",
		call: func(ctx context.Context, s Service, raw json.RawMessage) (any, error) {
			if err := decodeArgs(raw, &struct{}{}); err != nil {
				return nil, err
			}
			return s.Config(ctx)
		}},
}

// Ops returns the table of admin operations.
func Ops() []Op { return append([]Op(nil), ops...) }

// opNames lists the ops' names, for an error naming them.
func opNames() string {
	names := make([]string, len(ops))
	for i, o := range ops {
		names[i] = o.Name
	}
	return strings.Join(names, ", ")
}

// Lookup returns the op called name.
func Lookup(name string) (Op, bool) {
	for _, o := range ops {
		if o.Name == name {
			return o, true
		}
	}
	return Op{}, false
}

// Limits of explain's arguments: a request's (package descriptor).
const (
	maxDescriptors = descriptor.MaxDescriptors
	maxNameLen     = descriptor.MaxNameLen
	maxValueLen    = descriptor.MaxValueLen
)

func (a *ExplainArgs) validate() error {
	if len(a.Descriptors) == 0 {
		return Errorf(CodeBadRequest, "descriptors: give at least one name=value")
	}
	if len(a.Descriptors) > maxDescriptors {
		return Errorf(CodeBadRequest, "descriptors: %d, at most %d", len(a.Descriptors), maxDescriptors)
	}
	for i, d := range a.Descriptors {
		if d.Name == "" || len(d.Name) > maxNameLen {
			return Errorf(CodeBadRequest, "descriptors[%d]: name %q empty or longer than %d bytes", i, d.Name, maxNameLen)
		}
		if len(d.Value) > maxValueLen {
			return Errorf(CodeBadRequest, "descriptors[%d] %s: value longer than %d bytes", i, d.Name, maxValueLen)
		}
	}
	if a.Cost < 0 || a.Cost > 1<<32-1 {
		return Errorf(CodeBadRequest, "cost = %d: must be from 0 to 4294967295 (0 means 1)", a.Cost)
	}
	return nil
}

// decodeArgs decodes raw (absent means {}) into v, refusing unknown
// fields.
func decodeArgs(raw json.RawMessage, v any) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if err := strictUnmarshal(raw, v); err != nil {
		return Errorf(CodeBadRequest, "args: %v", err)
	}
	return nil
}

// Server runs admin requests for the faces: it decodes them, runs their
// op on Service, and logs refusals and changes with their caller.
type Server struct {
	Service Service
	// Log receives refused requests (warn), changes (info) and reads
	// (debug).
	Log *slog.Logger
	// Changed, when set, is called after every request of an op that
	// changes state, with its outcome (the decision log records it).
	Changed func(who Caller, op string, args json.RawMessage, err *Error)
}

// Serve runs the request body (a JSON Request) for who, who the face has
// authorised.
func (s *Server) Serve(ctx context.Context, who Caller, body []byte) Response {
	var req Request
	if err := strictUnmarshal(body, &req); err != nil {
		return s.refused(who, "", ReasonBadRequest, Errorf(CodeBadRequest, "request is not {\"op\":...,\"args\":{...}}: %v", err))
	}
	return s.Run(ctx, who, req)
}

// Run runs req for who, who the face has authorised.
func (s *Server) Run(ctx context.Context, who Caller, req Request) Response {
	op, ok := Lookup(req.Op)
	if !ok {
		return s.refused(who, req.Op, ReasonUnknownOp, Errorf(CodeUnknownOp, "no admin op %q (the ops: %s)", req.Op, opNames()))
	}
	if !who.Role.Allows(op) {
		return s.refused(who, op.Name, ReasonRole, Errorf(CodeForbidden,
			"op %q changes state: the %s role may run only explain, top, list and config (a write token is admin.token_file's, a write uid is in admin.socket_uids)", op.Name, who.Role))
	}
	v, err := op.call(withCaller(ctx, who), s.Service, req.Args)
	var res Response
	if err == nil {
		b, merr := json.Marshal(v)
		if merr != nil {
			err = fmt.Errorf("cannot encode the answer: %w", merr)
		}
		res.Result = b
	}
	if err != nil {
		var ae *Error
		if !errors.As(err, &ae) {
			ae = Errorf(CodeInternal, "%v", err)
		}
		res = Response{Err: ae}
	}
	switch {
	case op.Changes:
		s.logger().Info("admin change", slog.Any("who", who), slog.String("op", op.Name),
			slog.String("args", string(req.Args)), slog.Bool("ok", res.Err == nil), slog.Any("error", errOrNil(res.Err)))
		if s.Changed != nil {
			s.Changed(who, op.Name, req.Args, res.Err)
		}
	case res.Err != nil:
		refusedBy(Reason(res.Err.Code)).Inc()
		s.logger().Warn("admin request refused", slog.Any("who", who), slog.String("op", op.Name), slog.Any("error", res.Err))
	default:
		s.logger().Debug("admin request", slog.Any("who", who), slog.String("op", op.Name))
	}
	return res
}

// Refuse answers a request of op that the face did not authorise, logs
// it with its caller and op, and counts it under reason in
// rld_admin_refused_total. The face names op as the request does (the
// URL's, or the body's "op"), or "" when it cannot tell.
func (s *Server) Refuse(who Caller, op string, reason Reason, code Code, message string) Response {
	return s.refused(who, op, reason, &Error{Code: code, Message: message})
}

func (s *Server) refused(who Caller, op string, reason Reason, e *Error) Response {
	refusedBy(reason).Inc()
	if len(op) > maxNameLen {
		op = op[:maxNameLen] + "…"
	}
	s.logger().Warn("admin request refused", slog.Any("who", who), slog.String("op", op),
		slog.String("reason", string(reason)), slog.Any("error", e))
	return Response{Err: e}
}

// OpOf returns the "op" of an admin request body, or "" when the body is
// not a JSON object with a string op: for a refusal's log line, before
// the request is read for running.
func OpOf(body []byte) string {
	var r struct {
		Op string `json:"op"`
	}
	_ = json.Unmarshal(body, &r)
	return r.Op
}

func (s *Server) logger() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

func errOrNil(e *Error) error {
	if e == nil {
		return nil
	}
	return e
}
