package main

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/rld/rld/wire"
)

// keyPlaceholder in a descriptor value is replaced by the key number.
const keyPlaceholder = "{n}"

// template is a parsed -descriptors flag: the descriptors of every
// request, whose values may hold {n}, replaced by the request's key
// number. It is read-only once parsed, so connections share it.
type template struct {
	descs []tmplDesc
}

// tmplDesc is one name=value pair of a template. The value is parts[0],
// the key number, parts[1], the key number, … parts[len-1].
type tmplDesc struct {
	name  []byte
	parts [][]byte
}

// parseTemplate parses space-separated name=value pairs, such as
// "api_key=k{n} endpoint=/v1/search". maxKey is the largest key number,
// used to check that expanded values fit the protocol's limits.
func parseTemplate(s string, maxKey int) (*template, error) {
	fields := strings.Fields(s)
	if len(fields) > wire.MaxDescriptors {
		return nil, fmt.Errorf("%d descriptors, at most %d", len(fields), wire.MaxDescriptors)
	}
	t := &template{}
	digits := len(strconv.Itoa(maxKey))
	for _, f := range fields {
		name, value, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("descriptor %q: want name=value", f)
		}
		if name == "" || len(name) > wire.MaxNameLen {
			return nil, fmt.Errorf("descriptor %q: name must be 1 to %d bytes", f, wire.MaxNameLen)
		}
		if strings.Contains(name, keyPlaceholder) {
			return nil, fmt.Errorf("descriptor %q: %s may appear in the value only", f, keyPlaceholder)
		}
		d := tmplDesc{name: []byte(name)}
		for _, p := range strings.Split(value, keyPlaceholder) {
			d.parts = append(d.parts, []byte(p))
		}
		if n := len(value) + (len(d.parts)-1)*(digits-len(keyPlaceholder)); n > wire.MaxValueLen {
			return nil, fmt.Errorf("descriptor %q: value of up to %d bytes, at most %d", f, n, wire.MaxValueLen)
		}
		t.descs = append(t.descs, d)
	}
	return t, nil
}

// names returns the distinct descriptor names, in order.
func (t *template) names() []string {
	var out []string
	for _, d := range t.descs {
		if !slices.Contains(out, string(d.name)) {
			out = append(out, string(d.name))
		}
	}
	return out
}

// keyed reports whether a value holds {n}: whether each key number is a
// counter of its own under a rule keyed by every descriptor.
func (t *template) keyed() bool {
	for _, d := range t.descs {
		if len(d.parts) > 1 {
			return true
		}
	}
	return false
}

// String returns the template as written on the command line.
func (t *template) String() string {
	var b strings.Builder
	for i, d := range t.descs {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.Write(d.name)
		b.WriteByte('=')
		b.Write(bytes.Join(d.parts, []byte(keyPlaceholder)))
	}
	return b.String()
}

// appendValue appends the value of descriptor i for key n to dst.
func (t *template) appendValue(dst []byte, i, n int) []byte {
	parts := t.descs[i].parts
	dst = append(dst, parts[0]...)
	for _, p := range parts[1:] {
		dst = strconv.AppendInt(dst, int64(n), 10)
		dst = append(dst, p...)
	}
	return dst
}

// expand writes the descriptors of key n: their values go to scratch
// (reset first) and descs (reset first) points into it and into t. It
// returns both, so that callers can keep the grown buffers; once they
// are large enough it does not allocate.
func (t *template) expand(n int, scratch []byte, descs []wire.Descriptor) ([]byte, []wire.Descriptor) {
	var ends [wire.MaxDescriptors]int
	scratch = scratch[:0]
	for i := range t.descs {
		scratch = t.appendValue(scratch, i, n)
		ends[i] = len(scratch)
	}
	descs = descs[:0]
	start := 0
	for i, d := range t.descs {
		descs = append(descs, wire.Descriptor{Name: d.name, Value: scratch[start:ends[i]:ends[i]]})
		start = ends[i]
	}
	return scratch, descs
}

// appendKey appends the values of key n's descriptors, joined by '|', to
// dst: the counter key of a rule keyed by every descriptor.
func (t *template) appendKey(dst []byte, n int) []byte {
	for i := range t.descs {
		if i > 0 {
			dst = append(dst, '|')
		}
		dst = t.appendValue(dst, i, n)
	}
	return dst
}
