// Package policy decides requests: it matches descriptors against the
// allow and deny lists and the rules of a configuration, and asks a Store
// for one decision per matched limit.
package policy
