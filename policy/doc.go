// Package policy decides requests: it matches descriptors against the
// allow and deny lists and the rules of a configuration, and asks a Store
// for one decision per matched limit. When a shared store fails, a
// Fallback decides by each rule's fail mode: on local state at the
// daemon's fair share (open), or denied (closed).
package policy
