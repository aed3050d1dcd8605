package envoyrls

import (
	"errors"
	"fmt"
	"strings"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/rld/rld/descriptor"
)

// The descriptors that the face adds to every Envoy descriptor before its
// entries. They come first, so a rule's match on them sees the face's
// values even when an entry uses the same key: lookup takes the first
// descriptor of a name.
const (
	// DomainDescriptor carries the request's domain.
	DomainDescriptor = "domain"
	// KeysDescriptor carries the descriptor's entry keys in order, joined
	// by KeySep ("remote_address.path"): a rule matching it applies to
	// descriptors of exactly that depth and key sequence, as a node of
	// envoyproxy/ratelimit's descriptor tree does.
	KeysDescriptor = "envoy_keys"
	// KeySep joins the keys in KeysDescriptor's value.
	KeySep = "."
)

// errBadDescriptor is wrapped by every error of a descriptor that cannot
// be mapped: the face answers it with InvalidArgument.
var errBadDescriptor = errors.New("invalid descriptor")

// mapper builds the rld descriptors of Envoy descriptors into reused
// buffers. It is not safe for concurrent use.
type mapper struct {
	descs []descriptor.Descriptor
	buf   []byte
}

// mapDescriptor sets m.descs to the rld descriptors of d in domain:
// domain=DOMAIN, envoy_keys=K1.K2…, then K1=V1, K2=V2… in order. The
// slices point into m.buf, valid until the next call.
func (m *mapper) mapDescriptor(domain string, d *rlv3.RateLimitDescriptor) error {
	entries := d.GetEntries()
	if len(entries) == 0 {
		return fmt.Errorf("%w: no entries", errBadDescriptor)
	}
	if len(entries)+2 > descriptor.MaxDescriptors {
		return fmt.Errorf("%w: %d entries, at most %d", errBadDescriptor, len(entries), descriptor.MaxDescriptors-2)
	}
	size := len(DomainDescriptor) + len(domain) + len(KeysDescriptor)
	keysLen := 0
	for i, e := range entries {
		k, v := e.GetKey(), e.GetValue()
		if k == "" || len(k) > descriptor.MaxNameLen {
			return fmt.Errorf("%w: entry %d: key of %d bytes, want 1 to %d", errBadDescriptor, i, len(k), descriptor.MaxNameLen)
		}
		if len(v) > descriptor.MaxValueLen {
			return fmt.Errorf("%w: entry %d (%s): value of %d bytes, at most %d", errBadDescriptor, i, k, len(v), descriptor.MaxValueLen)
		}
		size += len(k) + len(v)
		keysLen += len(k) + len(KeySep)
	}
	keysLen -= len(KeySep)
	if keysLen > descriptor.MaxValueLen {
		return fmt.Errorf("%w: keys of %d bytes together, at most %d", errBadDescriptor, keysLen, descriptor.MaxValueLen)
	}
	size += keysLen
	// One allocation-free fill: the buffer never grows below, so the
	// slices taken from it stay valid.
	if cap(m.buf) < size {
		m.buf = make([]byte, 0, size)
	}
	m.buf = m.buf[:0]
	m.descs = m.descs[:0]
	m.add(DomainDescriptor, domain)
	start := len(m.buf)
	m.buf = append(m.buf, KeysDescriptor...)
	name := m.buf[start:len(m.buf):len(m.buf)]
	start = len(m.buf)
	for i, e := range entries {
		if i > 0 {
			m.buf = append(m.buf, KeySep...)
		}
		m.buf = append(m.buf, e.GetKey()...)
	}
	m.descs = append(m.descs, descriptor.Descriptor{Name: name, Value: m.buf[start:len(m.buf):len(m.buf)]})
	for _, e := range entries {
		m.add(e.GetKey(), e.GetValue())
	}
	return nil
}

// add appends the descriptor name=value, copied into m.buf.
func (m *mapper) add(name, value string) {
	start := len(m.buf)
	m.buf = append(m.buf, name...)
	n := m.buf[start:len(m.buf):len(m.buf)]
	start = len(m.buf)
	m.buf = append(m.buf, value...)
	m.descs = append(m.descs, descriptor.Descriptor{Name: n, Value: m.buf[start:len(m.buf):len(m.buf)]})
}

// joinKeys returns the KeysDescriptor value of a key path.
func joinKeys(keys []string) string { return strings.Join(keys, KeySep) }
