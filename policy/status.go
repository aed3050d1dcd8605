package policy

import "strconv"

// Status is a decision's outcome. The daemon writes it on the wire (as
// wire.Status) and in HTTP answers; policy owns it, so that a new
// outcome is a policy change first.
type Status uint8

// Statuses.
const (
	// StatusAllowed: every applicable rule allows.
	StatusAllowed Status = iota
	// StatusLimited: a rule denies (see Decision.RetryAfter).
	StatusLimited
	// StatusBlocked: the deny list matched.
	StatusBlocked
	// StatusAllowedDegraded: allowed, and a rule's store failed: its
	// fail mode decided (see Fallback).
	StatusAllowedDegraded
	// StatusError: the check could not be decided (see Decision.Code).
	StatusError
	// NumStatuses is the number of statuses: tables indexed by Status
	// are this long.
	NumStatuses
)

var statusNames = [NumStatuses]string{"allowed", "limited", "blocked", "allowed-degraded", "error"}

// String returns the status as written in docs, logs and HTTP answers,
// e.g. "limited".
func (s Status) String() string {
	if s < NumStatuses {
		return statusNames[s]
	}
	return "status(" + strconv.Itoa(int(s)) + ")"
}

// Allowed reports whether s lets the request through.
func (s Status) Allowed() bool { return s == StatusAllowed || s == StatusAllowedDegraded }

// Code says what failed in a StatusError decision.
type Code uint8

// Codes.
const (
	// CodeNone: the decision is not an error.
	CodeNone Code = iota
	// CodeCostTooLarge: the cost exceeds a limit's capacity (the Err
	// wraps ErrCostTooLarge).
	CodeCostTooLarge
	// CodeInternal: a store failed, and no fail mode decided.
	CodeInternal
	// CodeNotFound: a release named a lease that holds no slot (the Err
	// wraps ErrUnknownLease).
	CodeNotFound
	// CodeMalformed: a release named a lease that does not parse (the
	// Err wraps ErrBadLease), or an acquire peeked (ErrAcquirePeek).
	CodeMalformed
	// NumCodes is the number of codes.
	NumCodes
)

var codeNames = [NumCodes]string{"none", "cost_too_large", "internal", "not_found", "malformed"}

// String returns the code's name, e.g. "internal".
func (c Code) String() string {
	if c < NumCodes {
		return codeNames[c]
	}
	return "code(" + strconv.Itoa(int(c)) + ")"
}
