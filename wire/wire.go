// Package wire is rld's binary protocol: length-prefixed, big-endian frames
// over a stream socket, encoded into caller buffers and decoded without
// allocating.
//
// Every frame starts with a 12-byte header:
//
//	u32 length   bytes that follow this field (8 + body)
//	u8  version  Version
//	u8  op       request op, or response op (request op | OpResponse)
//	u16 flags    request: must be 0; response: FlagDegraded
//	u32 id       chosen by the client, echoed by the response
//
// A CHECK or PEEK request body is:
//
//	u32 cost     units to take; 0 means 1
//	u8  count    number of descriptors (≤ MaxDescriptors)
//	count × { u8 name length, name, u16 value length, value }
//
// An ACQUIRE request body is a CHECK's. A RELEASE request body is:
//
//	u16 lease length (1 to MaxTokenLen), lease: the token an ACQUIRE
//	    answer carried
//
// and a SETTLE request body is:
//
//	u32 cost     the request's actual cost; 0 means 1
//	u16 lease length (1 to MaxTokenLen), lease
//
// A PING request has an empty body. An ADMIN request's body is a JSON
// object (1 to MaxAdminBody bytes), and its response body is a u16 error
// code followed by a JSON payload (see AdminResponse). Every other
// response body is:
//
//	u8  status       Status
//	u64 limit        0 when no limit applied
//	u64 remaining
//	u32 reset        milliseconds
//	u32 retry after  milliseconds; 0 unless limited
//	u32 window       milliseconds, the limit's period; 0 when no limit applied
//	u64 quota        sustained units per quota window; 0 when no limit applied
//	u32 quota window milliseconds
//	u32 next         milliseconds until quota comes back (RateLimit's t);
//	                 NextUnknown when absent
//	u8  rule length, rule name
//	u16 error code   0 unless status is StatusError
//	u16 message length, message
//
// and, in an ACQUIRE's response only, by:
//
//	u16 lease length (0 to MaxTokenLen), lease: the token to RELEASE the
//	    concurrency slots taken; empty when none was
//
// docs/protocol.md has the full description with a worked example.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Version is the protocol version this package speaks.
const Version = 1

// Protocol limits. A frame that breaks one is answered with an error.
const (
	// HeaderSize is the size of a frame header, length field included.
	HeaderSize = 12
	// MaxFrame is the largest frame, length field included. It holds a
	// request's attributes at their limits (see MaxAttrValueLen).
	MaxFrame = 64 << 10
	// MaxDescriptors is the most descriptors one request may carry.
	MaxDescriptors = 32
	// MaxNameLen is the longest descriptor name.
	MaxNameLen = 64
	// MaxValueLen is the longest descriptor value.
	MaxValueLen = 1024
	// MaxAttrValueLen is the longest value of an attribute: a descriptor
	// whose name starts with AttrPrefix (see IsAttr).
	MaxAttrValueLen = 16 << 10
	// MaxRuleLen is the longest rule name in a response.
	MaxRuleLen = 255
	// MaxMessageLen is the longest error message in a response.
	MaxMessageLen = 1024
	// MaxAdminBody is the longest ADMIN request body (its JSON) and the
	// longest ADMIN response payload: what fits in a frame.
	MaxAdminBody = MaxFrame - HeaderSize - 2
	// MaxTokenLen is the longest token: the lease of an ACQUIRE answer,
	// given back by RELEASE.
	MaxTokenLen = 1024
)

// Op is a frame's operation.
type Op uint8

// Request ops. Responses carry the request's op with OpResponse set.
const (
	OpCheck   Op = 0x01 // decide and consume
	OpPeek    Op = 0x02 // decide, consume nothing
	OpPing    Op = 0x03 // liveness; answered with StatusAllowed
	OpReset   Op = 0x04 // reserved: clear a key's state
	OpAcquire Op = 0x05 // decide as CHECK, and hold concurrency slots
	OpRelease Op = 0x06 // give an ACQUIRE's concurrency slots back
	OpSettle  Op = 0x07 // settle an ACQUIRE's cost, known after its answer, and release it
	OpAdmin   Op = 0x08 // an admin operation: a JSON request, a JSON answer

	// OpResponse marks a response frame.
	OpResponse Op = 0x80
)

// IsReserved reports whether op is assigned to a later protocol feature.
func (op Op) IsReserved() bool { return op == OpReset }

// NextUnknown is a response's NextMs when the time until quota comes back
// is not known (or no limit applied): the RateLimit field then has no t.
const NextUnknown uint32 = 0xFFFFFFFF

// Response flags.
const (
	// FlagDegraded marks an answer made on local state alone because the
	// shared store could not be reached.
	FlagDegraded uint16 = 0x0001
)

// Status is the decision a response carries.
type Status uint8

// Statuses.
const (
	StatusAllowed         Status = 0
	StatusLimited         Status = 1
	StatusBlocked         Status = 2
	StatusAllowedDegraded Status = 3
	StatusError           Status = 4
)

var statusNames = [...]string{"allowed", "limited", "blocked", "allowed-degraded", "error"}

// String returns the status as written in docs and logs, e.g. "limited".
func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Allowed reports whether s lets the request through.
func (s Status) Allowed() bool { return s == StatusAllowed || s == StatusAllowedDegraded }

// Code is an error code carried by a StatusError response.
type Code uint16

// Error codes.
const (
	CodeNone          Code = 0
	CodeMalformed     Code = 1  // the body does not parse
	CodeFrameTooLarge Code = 2  // length above MaxFrame; the connection is closed
	CodeUnknownOp     Code = 3  // op not defined in this version
	CodeBadVersion    Code = 4  // version byte is not Version
	CodeTooLarge      Code = 5  // too many descriptors, or one too long
	CodeCostTooLarge  Code = 6  // the cost exceeds a limit's capacity: never admitted
	CodeInternal      Code = 7  // the daemon failed; retry
	CodeOverloaded    Code = 8  // too many requests in flight; retry later
	CodeNotSupported  Code = 9  // a reserved op this daemon does not serve yet
	CodeBadFlags      Code = 10 // unknown request flag bits set
	CodeUnavailable   Code = 11 // the shared store is unreachable and the rule fails closed
	CodeBadCost       Code = 12 // cost out of range
	CodeForbidden     Code = 13 // the peer may not use this op (an ADMIN frame from a uid not allowed)
	CodeNotFound      Code = 14 // an admin operation named something that does not exist
)

var codeNames = [...]string{"none", "malformed", "frame_too_large", "unknown_op", "bad_version",
	"too_large", "cost_too_large", "internal", "overloaded", "not_supported", "bad_flags",
	"unavailable", "bad_cost", "forbidden", "not_found"}

// String returns the code's name, e.g. "malformed".
func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("code(%d)", uint16(c))
}

// Error is a decoding failure with the code its error response carries.
type Error struct {
	Code Code
	Msg  string
}

func (e *Error) Error() string { return "wire: " + e.Code.String() + ": " + e.Msg }

// Decoding errors. They are *Error values, so errors.As gives the code.
var (
	// ErrShortFrame: the length field is below the header size; framing is lost.
	ErrShortFrame = &Error{CodeMalformed, "frame length below header size"}
	// ErrFrameTooLarge: the length field is above MaxFrame.
	ErrFrameTooLarge = &Error{CodeFrameTooLarge, "frame length above limit"}
	// ErrBadVersion: the version byte is not Version.
	ErrBadVersion = &Error{CodeBadVersion, "unsupported protocol version"}
	// ErrTruncated: a field runs past the end of the frame.
	ErrTruncated = &Error{CodeMalformed, "field runs past end of frame"}
	// ErrTrailing: bytes are left after the last field.
	ErrTrailing = &Error{CodeMalformed, "trailing bytes after last field"}
	// ErrTooManyDescriptors: more than MaxDescriptors.
	ErrTooManyDescriptors = &Error{CodeTooLarge, "too many descriptors"}
	// ErrNameTooLong: a descriptor name longer than MaxNameLen, or empty.
	ErrNameTooLong = &Error{CodeTooLarge, "descriptor name empty or too long"}
	// ErrValueTooLong: a descriptor value longer than MaxValueLen, or an
	// attribute's longer than MaxAttrValueLen.
	ErrValueTooLong = &Error{CodeTooLarge, "descriptor value too long"}
	// ErrUnknownOp: the op is not defined.
	ErrUnknownOp = &Error{CodeUnknownOp, "unknown op"}
	// ErrBadFlags: a request sets flag bits this version does not define.
	ErrBadFlags = &Error{CodeBadFlags, "unknown flag bits"}
	// ErrBadStatus: a response carries an undefined status.
	ErrBadStatus = &Error{CodeMalformed, "unknown status"}
	// ErrNotSupported: the op is reserved for a later protocol feature.
	ErrNotSupported = &Error{CodeNotSupported, "op reserved for a later version"}
	// ErrNotResponse: DecodeResponse was given a frame without OpResponse.
	ErrNotResponse = &Error{CodeMalformed, "not a response frame"}
	// ErrMessageTooLong: a response message longer than MaxMessageLen.
	ErrMessageTooLong = &Error{CodeTooLarge, "message too long"}
	// ErrEmptyAdmin: an ADMIN request without a body.
	ErrEmptyAdmin = &Error{CodeMalformed, "admin request without a body"}
	// ErrAdminTooLarge: an ADMIN request body above MaxAdminBody.
	ErrAdminTooLarge = &Error{CodeTooLarge, "admin request body too long"}
	// ErrBadToken: a RELEASE without a lease, or a token longer than
	// MaxTokenLen.
	ErrBadToken = &Error{CodeMalformed, "token empty or longer than 1024 bytes"}
	// ErrNotAdmin: DecodeAdminResponse was given a frame that does not
	// answer an ADMIN request.
	ErrNotAdmin = &Error{CodeMalformed, "not an admin response frame"}
)

// CodeOf returns the code of err if it is an *Error, else CodeInternal.
func CodeOf(err error) Code {
	var we *Error
	if errors.As(err, &we) {
		return we.Code
	}
	return CodeInternal
}

// Descriptor is one (name, value) pair of a request, such as
// api_key=sk_123. Decoded descriptors alias the frame they came from.
type Descriptor struct {
	Name  []byte
	Value []byte
}

// AttrPrefix starts the name of an attribute: a raw fact about an HTTP
// request (":peer", ":method", ":host", ":target", ":h:<header>") that the
// daemon turns into descriptors by the [request] rules of its
// configuration, rather than a descriptor a rule matches on. Attributes
// may carry values up to MaxAttrValueLen bytes.
const AttrPrefix = ':'

// IsAttr reports whether name is an attribute's name.
func IsAttr(name []byte) bool { return len(name) > 0 && name[0] == AttrPrefix }

// Header is the fixed part of every frame.
type Header struct {
	Length  uint32 // bytes after the length field
	Version uint8
	Op      Op
	Flags   uint16
	ID      uint32
}

// Request is a decoded request frame. Descriptors and Body alias the
// frame. A Request is a plain value: one goroutine decodes into it and
// reads it.
type Request struct {
	Op    Op
	Flags uint16
	ID    uint32
	Cost  uint32
	Descs []Descriptor
	// Body is an ADMIN request's JSON; nil for the other ops.
	Body []byte
	// Token is a RELEASE or SETTLE request's lease; nil for the other
	// ops. A SETTLE's Cost is the actual cost.
	Token []byte
}

// Response is a decoded response frame. Rule and Message alias the frame.
// Like Request, it is not safe for concurrent use.
type Response struct {
	Op        Op // the request's op (without OpResponse)
	Flags     uint16
	ID        uint32
	Status    Status
	Limit     uint64
	Remaining uint64
	ResetMs   uint32
	RetryMs   uint32
	WindowMs  uint32 // the deciding limit's window (period); 0 when no limit applied
	// Quota is the sustained units per QuotaWindowMs that a client pacing
	// itself evenly is never refused at (RateLimit-Policy's q); 0 when no
	// limit applied.
	Quota         uint64
	QuotaWindowMs uint32 // the window of Quota (RateLimit-Policy's w)
	// NextMs is the time until quota comes back, within which no more
	// than Remaining units can be used (RateLimit's t); NextUnknown when
	// absent. The zero value means 0 ms, not absent.
	NextMs  uint32
	Rule    []byte
	Code    Code
	Message []byte
	// Token is, in the answer to an ACQUIRE, the lease that gives its
	// concurrency slots back (RELEASE); empty when it took none. Other
	// answers carry none.
	Token []byte
}

// ParseHeader reads the header at the start of b. It needs HeaderSize bytes
// (ErrTruncated otherwise) and checks only the length field: ErrShortFrame
// when framing is lost, ErrFrameTooLarge when the frame is above MaxFrame.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, ErrTruncated
	}
	h := Header{
		Length:  binary.BigEndian.Uint32(b),
		Version: b[4],
		Op:      Op(b[5]),
		Flags:   binary.BigEndian.Uint16(b[6:]),
		ID:      binary.BigEndian.Uint32(b[8:]),
	}
	if h.Length < HeaderSize-4 {
		return h, ErrShortFrame
	}
	if h.Length > MaxFrame-4 {
		return h, ErrFrameTooLarge
	}
	return h, nil
}

// Next returns the first complete frame at the start of b and its size.
// It returns (nil, 0, nil) when b holds only part of a frame, and an error
// when the length field is out of range (framing is lost). It never copies.
func Next(b []byte) (frame []byte, n int, err error) {
	if len(b) < 4 {
		return nil, 0, nil
	}
	length := binary.BigEndian.Uint32(b)
	if length < HeaderSize-4 {
		return nil, 0, ErrShortFrame
	}
	if length > MaxFrame-4 {
		return nil, 0, ErrFrameTooLarge
	}
	n = int(length) + 4
	if len(b) < n {
		return nil, 0, nil
	}
	return b[:n], n, nil
}

// checkSize reports whether f is exactly the frame its length field
// announces.
func checkSize(length uint32, f []byte) error {
	switch n := int(length) + 4; {
	case len(f) < n:
		return ErrTruncated
	case len(f) > n:
		return ErrTrailing
	}
	return nil
}

func appendHeader(dst []byte, op Op, flags uint16, id uint32) []byte {
	dst = append(dst, 0, 0, 0, 0, Version, byte(op))
	dst = binary.BigEndian.AppendUint16(dst, flags)
	return binary.BigEndian.AppendUint32(dst, id)
}

func finishFrame(dst []byte, start int) []byte {
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-4))
	return dst
}

// AppendRequest appends the encoding of r to dst. Descriptors are written
// as given; it is the caller's job to respect the limits (a daemon answers
// violations with an error).
func AppendRequest(dst []byte, r *Request) []byte {
	start := len(dst)
	dst = appendHeader(dst, r.Op, r.Flags, r.ID)
	if r.Op == OpSettle {
		dst = binary.BigEndian.AppendUint32(dst, r.Cost)
	}
	if r.Op == OpRelease || r.Op == OpSettle {
		dst = binary.BigEndian.AppendUint16(dst, uint16(len(r.Token)))
		dst = append(dst, r.Token...)
	}
	if r.Op == OpCheck || r.Op == OpPeek || r.Op == OpAcquire {
		dst = binary.BigEndian.AppendUint32(dst, r.Cost)
		dst = append(dst, byte(len(r.Descs)))
		for _, d := range r.Descs {
			dst = append(dst, byte(len(d.Name)))
			dst = append(dst, d.Name...)
			dst = binary.BigEndian.AppendUint16(dst, uint16(len(d.Value)))
			dst = append(dst, d.Value...)
		}
	}
	if r.Op == OpAdmin {
		dst = append(dst, r.Body...)
	}
	return finishFrame(dst, start)
}

// DecodeRequest decodes the complete request frame f into r, reusing
// r.Descs. On error, r.ID holds the request id when the header was intact,
// so the caller can answer it.
func DecodeRequest(f []byte, r *Request) error {
	r.Descs = r.Descs[:0]
	r.Cost = 0
	r.Body, r.Token = nil, nil
	// The header is read field by field rather than through ParseHeader:
	// a Header value is copied through memory, which costs more than the
	// rest of a typical decode.
	if len(f) < HeaderSize {
		r.Op, r.Flags, r.ID = 0, 0, 0
		return ErrTruncated
	}
	length, op, flags := binary.BigEndian.Uint32(f), Op(f[5]), binary.BigEndian.Uint16(f[6:])
	r.Op, r.Flags, r.ID = op, flags, binary.BigEndian.Uint32(f[8:])
	switch {
	case length < HeaderSize-4:
		return ErrShortFrame
	case length > MaxFrame-4:
		return ErrFrameTooLarge
	}
	if err := checkSize(length, f); err != nil {
		return err
	}
	if f[4] != Version {
		return ErrBadVersion
	}
	if flags != 0 {
		return ErrBadFlags
	}
	b := f[HeaderSize:]
	switch op {
	case OpPing:
		if len(b) != 0 {
			return ErrTrailing
		}
		return nil
	case OpAdmin:
		switch {
		case len(b) == 0:
			return ErrEmptyAdmin
		case len(b) > MaxAdminBody:
			return ErrAdminTooLarge
		}
		r.Body = b[:len(b):len(b)]
		return nil
	case OpRelease, OpSettle:
		if op == OpSettle {
			if len(b) < 4 {
				return ErrTruncated
			}
			r.Cost, b = binary.BigEndian.Uint32(b), b[4:]
		}
		tok, rest, err := token(b)
		if err != nil {
			return err
		}
		if len(rest) != 0 {
			return ErrTrailing
		}
		r.Token = tok
		return nil
	case OpCheck, OpPeek, OpAcquire:
	default:
		if op.IsReserved() {
			return ErrNotSupported
		}
		return ErrUnknownOp
	}
	if len(b) < 5 {
		return ErrTruncated
	}
	r.Cost = binary.BigEndian.Uint32(b)
	count := int(b[4])
	b = b[5:]
	if count > MaxDescriptors {
		return ErrTooManyDescriptors
	}
	for range count {
		if len(b) < 1 {
			return ErrTruncated
		}
		nl := int(b[0])
		if nl == 0 || nl > MaxNameLen {
			return ErrNameTooLong
		}
		if len(b) < 1+nl+2 {
			return ErrTruncated
		}
		name := b[1 : 1+nl : 1+nl]
		vl := int(binary.BigEndian.Uint16(b[1+nl:]))
		if vl > MaxValueLen && (vl > MaxAttrValueLen || name[0] != AttrPrefix) {
			return ErrValueTooLong
		}
		b = b[1+nl+2:]
		if len(b) < vl {
			return ErrTruncated
		}
		// Growing the slice and then setting the fields in place avoids
		// building the Descriptor on the stack and copying it.
		n := len(r.Descs)
		if n == cap(r.Descs) {
			r.Descs = append(r.Descs, Descriptor{})
		} else {
			r.Descs = r.Descs[:n+1]
		}
		d := &r.Descs[n]
		d.Name, d.Value = name, b[:vl:vl]
		b = b[vl:]
	}
	if len(b) != 0 {
		return ErrTrailing
	}
	return nil
}

// token reads a u16-length-prefixed token (1 to MaxTokenLen bytes) at the
// start of b and returns it and the rest of b.
func token(b []byte) (tok, rest []byte, err error) {
	if len(b) < 2 {
		return nil, nil, ErrTruncated
	}
	n := int(binary.BigEndian.Uint16(b))
	if n == 0 || n > MaxTokenLen {
		return nil, nil, ErrBadToken
	}
	if len(b) < 2+n {
		return nil, nil, ErrTruncated
	}
	return b[2 : 2+n : 2+n], b[2+n:], nil
}

// AppendResponse appends the encoding of r to dst. Rule and Message are
// cut to MaxRuleLen and MaxMessageLen. The answer to an ACQUIRE ends with
// its Token (cut to MaxTokenLen); other answers carry none.
func AppendResponse(dst []byte, r *Response) []byte {
	start := len(dst)
	dst = appendHeader(dst, r.Op|OpResponse, r.Flags, r.ID)
	dst = append(dst, byte(r.Status))
	dst = binary.BigEndian.AppendUint64(dst, r.Limit)
	dst = binary.BigEndian.AppendUint64(dst, r.Remaining)
	dst = binary.BigEndian.AppendUint32(dst, r.ResetMs)
	dst = binary.BigEndian.AppendUint32(dst, r.RetryMs)
	dst = binary.BigEndian.AppendUint32(dst, r.WindowMs)
	dst = binary.BigEndian.AppendUint64(dst, r.Quota)
	dst = binary.BigEndian.AppendUint32(dst, r.QuotaWindowMs)
	dst = binary.BigEndian.AppendUint32(dst, r.NextMs)
	rule := r.Rule
	if len(rule) > MaxRuleLen {
		rule = rule[:MaxRuleLen]
	}
	dst = append(dst, byte(len(rule)))
	dst = append(dst, rule...)
	dst = binary.BigEndian.AppendUint16(dst, uint16(r.Code))
	msg := r.Message
	if len(msg) > MaxMessageLen {
		msg = msg[:MaxMessageLen]
	}
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(msg)))
	dst = append(dst, msg...)
	if r.Op == OpAcquire {
		tok := r.Token
		if len(tok) > MaxTokenLen {
			tok = tok[:MaxTokenLen]
		}
		dst = binary.BigEndian.AppendUint16(dst, uint16(len(tok)))
		dst = append(dst, tok...)
	}
	return finishFrame(dst, start)
}

// responseFixed is the size of a response body without rule and message.
const responseFixed = 1 + 8 + 8 + 4 + 4 + 4 + 8 + 4 + 4 + 1 + 2 + 2

// DecodeResponse decodes the complete response frame f into r.
func DecodeResponse(f []byte, r *Response) error {
	*r = Response{}
	h, err := ParseHeader(f)
	r.Op, r.Flags, r.ID = h.Op&^OpResponse, h.Flags, h.ID
	if err != nil {
		return err
	}
	if err := checkSize(h.Length, f); err != nil {
		return err
	}
	if h.Version != Version {
		return ErrBadVersion
	}
	if h.Op&OpResponse == 0 {
		return ErrNotResponse
	}
	b := f[HeaderSize:]
	if len(b) < responseFixed {
		return ErrTruncated
	}
	r.Status = Status(b[0])
	if r.Status > StatusError {
		return ErrBadStatus
	}
	r.Limit = binary.BigEndian.Uint64(b[1:])
	r.Remaining = binary.BigEndian.Uint64(b[9:])
	r.ResetMs = binary.BigEndian.Uint32(b[17:])
	r.RetryMs = binary.BigEndian.Uint32(b[21:])
	r.WindowMs = binary.BigEndian.Uint32(b[25:])
	r.Quota = binary.BigEndian.Uint64(b[29:])
	r.QuotaWindowMs = binary.BigEndian.Uint32(b[37:])
	r.NextMs = binary.BigEndian.Uint32(b[41:])
	rl := int(b[45])
	b = b[46:]
	if len(b) < rl+4 {
		return ErrTruncated
	}
	r.Rule = b[:rl:rl]
	b = b[rl:]
	r.Code = Code(binary.BigEndian.Uint16(b))
	ml := int(binary.BigEndian.Uint16(b[2:]))
	b = b[4:]
	if ml > MaxMessageLen {
		return ErrMessageTooLong
	}
	if len(b) < ml {
		return ErrTruncated
	}
	r.Message = b[:ml:ml]
	b = b[ml:]
	if r.Op == OpAcquire {
		if len(b) < 2 {
			return ErrTruncated
		}
		n := int(binary.BigEndian.Uint16(b))
		if n > MaxTokenLen {
			return ErrBadToken
		}
		if len(b) < 2+n {
			return ErrTruncated
		}
		r.Token, b = b[2:2+n:2+n], b[2+n:]
	}
	if len(b) != 0 {
		return ErrTrailing
	}
	return nil
}

// AdminResponse is the answer to an ADMIN request. Its body is a u16 code
// (CodeNone on success) followed by a JSON payload: the operation's
// result, or an error object. Payload aliases the frame it was decoded
// from.
type AdminResponse struct {
	ID      uint32
	Flags   uint16
	Code    Code
	Payload []byte
}

// AppendAdminResponse appends the encoding of r to dst. The payload is
// written as given; the caller keeps it within MaxAdminBody.
func AppendAdminResponse(dst []byte, r *AdminResponse) []byte {
	start := len(dst)
	dst = appendHeader(dst, OpAdmin|OpResponse, r.Flags, r.ID)
	dst = binary.BigEndian.AppendUint16(dst, uint16(r.Code))
	dst = append(dst, r.Payload...)
	return finishFrame(dst, start)
}

// DecodeAdminResponse decodes the complete ADMIN response frame f into r.
func DecodeAdminResponse(f []byte, r *AdminResponse) error {
	*r = AdminResponse{}
	h, err := ParseHeader(f)
	r.ID, r.Flags = h.ID, h.Flags
	if err != nil {
		return err
	}
	if err := checkSize(h.Length, f); err != nil {
		return err
	}
	if h.Version != Version {
		return ErrBadVersion
	}
	if h.Op != OpAdmin|OpResponse {
		return ErrNotAdmin
	}
	b := f[HeaderSize:]
	if len(b) < 2 {
		return ErrTruncated
	}
	r.Code = Code(binary.BigEndian.Uint16(b))
	r.Payload = b[2:len(b):len(b)]
	return nil
}
