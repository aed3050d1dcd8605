package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// The admin API names descriptors one way on every face: a JSON object of
// name → value, {"api_key":"k","endpoint":"/v1/search"}. That is the form
// of explain's, reset's and grant's descriptors, of a counter key (the
// value of each of a rule's by descriptors) and of match globs; the
// entries of overrides and blocks are written so. Two other forms are
// accepted where they are unambiguous: descriptors as a list of
// {"name":…,"value":…}, and a key or match as text, name=value pairs
// joined by "," (see ParsePairs), which is how explain, top, reset and
// grant answer a counter key.

// Descriptors are the descriptors of a request, in order. They encode as
// a JSON object of name → value, and decode from one (or from a list of
// {"name":…,"value":…}); a name given twice is refused.
type Descriptors []Descriptor

// MarshalJSON writes d as a JSON object, in d's order.
func (d Descriptors) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, x := range d {
		if i > 0 {
			b.WriteByte(',')
		}
		n, err := json.Marshal(x.Name)
		if err != nil {
			return nil, err
		}
		v, err := json.Marshal(x.Value)
		if err != nil {
			return nil, err
		}
		b.Write(n)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// UnmarshalJSON reads a JSON object of name → value, keeping its order,
// or a list of {"name":…,"value":…}.
func (d *Descriptors) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	var out Descriptors
	switch {
	case len(b) > 0 && b[0] == '[':
		var list []Descriptor
		if err := strictUnmarshal(b, &list); err != nil {
			return fmt.Errorf("descriptors: %w", err)
		}
		out = list
	case len(b) > 0 && b[0] == '{':
		dec := json.NewDecoder(bytes.NewReader(b))
		if _, err := dec.Token(); err != nil { // {
			return fmt.Errorf("descriptors: %w", err)
		}
		for dec.More() {
			var name, value string
			tok, err := dec.Token()
			if err != nil {
				return fmt.Errorf("descriptors: %w", err)
			}
			name, _ = tok.(string)
			if err := dec.Decode(&value); err != nil {
				return fmt.Errorf("descriptors.%s: the value must be a string: %w", name, err)
			}
			out = append(out, Descriptor{Name: name, Value: value})
		}
	case string(b) == "null":
		*d = nil
		return nil
	default:
		return errors.New(`descriptors: give a JSON object of name → value ({"api_key":"k"})`)
	}
	seen := make(map[string]bool, len(out))
	for _, x := range out {
		if seen[x.Name] {
			return fmt.Errorf("descriptors: %q given twice", x.Name)
		}
		seen[x.Name] = true
	}
	*d = out
	return nil
}

// Pairs are descriptor names and values: a counter key (the value of each
// of a rule's by descriptors) or match globs. They encode as a JSON
// object of name → value, and decode from one or from text (ParsePairs):
// "api_key=k,tenant=t", as explain and top print a key.
type Pairs map[string]string

// UnmarshalJSON reads a JSON object of name → string, or text that
// ParsePairs reads.
func (p *Pairs) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case string(b) == "null":
		*p = nil
		return nil
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		m, err := ParsePairs(s)
		if err != nil {
			return err
		}
		*p = m
		return nil
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return errors.New(`give a JSON object of name → value ({"api_key":"k"}), or "name=value,…"`)
	}
	*p = m
	return nil
}

// String writes p as text that ParsePairs reads back when no value holds
// ",name=": its pairs sorted by name, joined by ",".
func (p Pairs) String() string {
	names := make([]string, 0, len(p))
	for n := range p {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(n + "=" + p[n])
	}
	return b.String()
}

// ParsePairs reads name=value pairs joined by ",": "api_key=k,tenant=t".
// A part without "=" continues the value before it, so "ip=a,b" is one
// pair whose value is "a,b"; a value that holds ",name=" needs the JSON
// object form. A name given twice, an empty name or an empty text is an
// error.
func ParsePairs(s string) (Pairs, error) {
	if s == "" {
		return nil, errors.New(`empty: give name=value`)
	}
	out := Pairs{}
	last := ""
	for _, part := range strings.Split(s, ",") {
		name, value, ok := strings.Cut(part, "=")
		if !ok {
			if last == "" {
				return nil, fmt.Errorf("%q: %q is not name=value", s, part)
			}
			out[last] += "," + part
			continue
		}
		if name == "" {
			return nil, fmt.Errorf("%q: empty name before =", s)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("%q: %s given twice", s, name)
		}
		out[name], last = value, name
	}
	return out, nil
}

// Sorted returns p as descriptors sorted by name.
func (p Pairs) Sorted() Descriptors {
	out := make(Descriptors, 0, len(p))
	for n, v := range p {
		out = append(out, Descriptor{Name: n, Value: v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// validate checks p's size against the protocol's limits; what names it
// in an error.
func (p Pairs) validate(what string) error {
	if len(p) > maxDescriptors {
		return Errorf(CodeBadRequest, "%s: %d descriptors, at most %d", what, len(p), maxDescriptors)
	}
	for n, v := range p {
		if n == "" || len(n) > maxNameLen {
			return Errorf(CodeBadRequest, "%s: name %q empty or longer than %d bytes", what, n, maxNameLen)
		}
		if len(v) > maxValueLen {
			return Errorf(CodeBadRequest, "%s.%s: value longer than %d bytes", what, n, maxValueLen)
		}
	}
	return nil
}
