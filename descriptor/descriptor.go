// Package descriptor holds what a rate-limit request is made of: its
// descriptors, (name, value) pairs such as api_key=sk_123, and the limits
// on them. It depends on nothing else of rld's, so that policy, config and
// derivation speak of descriptors without the binary protocol (package
// wire), which keeps a type and limits of its own that agree with these.
package descriptor

// Descriptor is one (name, value) pair of a request, such as
// api_key=sk_123. The bytes are not owned: a Descriptor aliases the
// request (or frame) it came from.
type Descriptor struct {
	Name  []byte
	Value []byte
}

// Limits on the descriptors of one request. A request that breaks one is
// refused where it is read.
const (
	// MaxDescriptors is the most descriptors one request may carry.
	MaxDescriptors = 32
	// MaxNameLen is the longest descriptor name.
	MaxNameLen = 64
	// MaxValueLen is the longest descriptor value (a longer one is sent
	// as its digest).
	MaxValueLen = 1024
)
