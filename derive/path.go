package derive

// The path rule, applied once to a request's raw target (see
// docs/requests.md):
//
//  1. An absolute-form target (http://host/p) keeps its path; a target not
//     starting with '/' is read as if it did.
//  2. The query ('?' onwards) and a fragment ('#' onwards) are cut off.
//  3. Every valid %XX escape is decoded, whatever its case; an invalid one
//     (%zz, a '%' near the end) is the byte '%' itself. A decoded %2F is a
//     slash like any other, as nginx reads it.
//  4. Segments are split on '/': empty ones are dropped (// is /), each is
//     cut at its first ';' (matrix parameters), "." is dropped and ".."
//     removes the segment before it (never above the root).
//  5. The result is '/' and the segments joined by '/', with no trailing
//     slash; a byte other than an unreserved character, a sub-delimiter,
//     ':' or '@' is written as %XX with upper-case hex (so NUL is %00, a
//     space %20, UTF-8 %C3%A9).
//
// The rule is idempotent: a normalised path normalises to itself.

// AppendPath appends the normalised path of the raw request target to dst.
func AppendPath(dst, target []byte) []byte {
	p := pathOf(target)
	start := len(dst)
	dst = append(dst, '/')
	// Segments are decoded into dst as they are read; seg marks where the
	// current one started, so "." and ".." can be undone in place.
	seg := len(dst)
	inParams := false
	flush := func(d []byte) []byte {
		s := d[seg:]
		switch {
		case len(s) == 0:
			return d
		case isDots(s, 1):
			return d[:seg]
		case isDots(s, 2):
			d = d[:seg]
			// Remove the segment before, with its slash.
			if seg-1 > start {
				i := seg - 2
				for i > start && d[i] != '/' {
					i--
				}
				d = d[:i+1]
			}
			seg = len(d)
			return d
		}
		d = append(d, '/')
		seg = len(d)
		return d
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c == '%' && i+2 < len(p)+0 && isHex(p[i+1]) && isHex(p[i+2]) {
			c = unhex(p[i+1])<<4 | unhex(p[i+2])
			i += 2
		}
		switch {
		case c == '/':
			dst = flush(dst)
			inParams = false
		case inParams:
		case c == ';':
			inParams = true
		default:
			dst = append(dst, c)
		}
	}
	dst = flush(dst)
	if len(dst) > start+1 && dst[len(dst)-1] == '/' {
		dst = dst[:len(dst)-1]
	}
	return encodeInPlace(dst, start)
}

// pathOf returns the path part of a raw request target.
func pathOf(t []byte) []byte {
	if n := schemeLen(t); n > 0 {
		t = t[n:]
		i := 0
		for i < len(t) && t[i] != '/' && t[i] != '?' && t[i] != '#' {
			i++
		}
		t = t[i:]
	}
	for i, c := range t {
		if c == '?' || c == '#' {
			return t[:i]
		}
	}
	return t
}

// schemeLen returns the length of "http://" or "https://" (any case) at
// the start of t, or 0.
func schemeLen(t []byte) int {
	for _, s := range [...]string{"http://", "https://"} {
		if len(t) >= len(s) && equalFold(t[:len(s)], s) {
			return len(s)
		}
	}
	return 0
}

func equalFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

func isDots(s []byte, n int) bool {
	if len(s) != n {
		return false
	}
	for _, c := range s {
		if c != '.' {
			return false
		}
	}
	return true
}

// encodeInPlace percent-encodes, from start on, the bytes of dst that a
// normalised path writes as %XX, and returns dst.
func encodeInPlace(dst []byte, start int) []byte {
	extra := 0
	for _, c := range dst[start:] {
		if !pathByte(c) {
			extra += 2
		}
	}
	if extra == 0 {
		return dst
	}
	n := len(dst)
	dst = append(dst, make([]byte, extra)...)
	w := len(dst)
	for r := n - 1; r >= start; r-- {
		c := dst[r]
		if pathByte(c) {
			w--
			dst[w] = c
			continue
		}
		w -= 3
		dst[w], dst[w+1], dst[w+2] = '%', upperHex[c>>4], upperHex[c&15]
	}
	return dst
}

const upperHex = "0123456789ABCDEF"

// pathByte reports whether c stands as itself in a normalised path:
// '/', an unreserved character, a sub-delimiter other than ';', ':' or '@'.
func pathByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '/', '-', '.', '_', '~', '!', '$', '&', '\'', '(', ')', '*', '+', ',', '=', ':', '@':
		return true
	}
	return false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}
