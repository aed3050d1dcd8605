package derive

import (
	"fmt"
	"slices"
	"strings"
)

// route is one route template, such as /v1/orders/{id}: literal
// segments, {name} for any one segment, and a last {name...} for one or
// more segments.
type route struct {
	text []byte
	segs []string // "" stands for a {name} segment
	rest bool     // the last segment is {name...}
}

// parseRoute reads a template. Its literal segments must be in normalised
// form (AppendPath leaves them as they are), so that a path can match.
func parseRoute(t string) (route, error) {
	if !strings.HasPrefix(t, "/") {
		return route{}, fmt.Errorf("%q: a template starts with /", t)
	}
	r := route{text: []byte(t)}
	parts := strings.Split(t[1:], "/")
	for i, p := range parts {
		switch {
		case strings.HasPrefix(p, "{") && strings.HasSuffix(p, "...}") && len(p) > 5:
			if i != len(parts)-1 {
				return route{}, fmt.Errorf("%q: {%s} may only be the last segment", t, p[1:len(p)-1])
			}
			r.rest = true
		case strings.HasPrefix(p, "{") && strings.HasSuffix(p, "}") && len(p) > 2:
			if strings.ContainsAny(p[1:len(p)-1], "{}/") {
				return route{}, fmt.Errorf("%q: segment %q is not a {name}", t, p)
			}
			r.segs = append(r.segs, "")
		case p == "":
			return route{}, fmt.Errorf("%q: empty segment (a template has no // and no trailing /)", t)
		default:
			if n := string(AppendPath(nil, []byte("/"+p))); n != "/"+p {
				return route{}, fmt.Errorf("%q: segment %q is not in normalised form (%q)", t, p, n[1:])
			}
			r.segs = append(r.segs, p)
		}
	}
	return r, nil
}

// route returns the text of the first template that matches the
// normalised path p, or nil.
func (d *Deriver) route(p []byte) []byte {
	for i := range d.routes {
		if d.routes[i].match(p) {
			return d.routes[i].text
		}
	}
	return nil
}

func (r *route) match(p []byte) bool {
	if len(p) == 0 || p[0] != '/' {
		return false
	}
	// A normalised path has no empty segment and no trailing slash: after
	// its last segment, p is nil.
	p = p[1:]
	if len(p) == 0 {
		p = nil
	}
	for _, s := range r.segs {
		if p == nil {
			return false
		}
		seg := p
		if i := indexByte(p, '/'); i >= 0 {
			seg, p = p[:i], p[i+1:]
		} else {
			p = nil
		}
		if s != "" && string(seg) != s {
			return false
		}
	}
	if r.rest {
		return p != nil
	}
	return p == nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
