package policy

import (
	"bytes"
	"regexp"
	"strings"

	"github.com/rld/rld/config"
)

// glob is a compiled glob: `*` matches any run of bytes (including '/'),
// `?` exactly one byte, every other byte itself. The common shapes (a
// literal, "prefix*", "*suffix", "*infix*", "*") get their own matchers;
// the rest fall back to a backtracking matcher. A pattern that starts
// with '~' is instead an RE2 regular expression that must match the
// whole value (see config.CompileRegexp). Matching never allocates (a
// regexp reuses its matching machines). A glob is immutable and safe for
// concurrent use.
type glob struct {
	kind globKind
	re   *regexp.Regexp // for globRegexp; pat holds the pattern as written
	lit  string         // the literal part, for every kind but globAny and globGeneral
	litb []byte         // lit as bytes, for bytes.Contains
	pat  string         // the pattern with runs of '*' collapsed, for globGeneral
	// For globSegments: the pattern is first*mid[0]*…*mid[n-1]*last.
	first, last string
	mid         [][]byte
}

type globKind uint8

const (
	globAny      globKind = iota // "*"
	globExact                    // "abc"
	globPrefix                   // "abc*"
	globSuffix                   // "*abc"
	globContains                 // "*abc*"
	globSegments                 // "a*b*c": stars only, one inside
	globGeneral                  // anything with '?' and a '*'
	globRegexp                   // "~re": a regular expression
)

// compileGlob compiles pattern. Every string is a valid glob; a "~re"
// pattern fails when re is not a valid regular expression.
func compileGlob(pattern string) (glob, error) {
	if re, ok, err := config.CompileRegexp(pattern); ok {
		if err != nil {
			return glob{}, err
		}
		return glob{kind: globRegexp, re: re, pat: pattern}, nil
	}
	return compileWildcards(pattern), nil
}

// compileWildcards compiles pattern as a glob of '*' and '?'.
func compileWildcards(pattern string) glob {
	p := collapseStars(pattern)
	if p == "*" {
		return glob{kind: globAny}
	}
	if !strings.Contains(p, "?") {
		inner := strings.Trim(p, "*")
		if !strings.Contains(inner, "*") {
			lead := strings.HasPrefix(p, "*")
			trail := len(p) > 1 && strings.HasSuffix(p, "*")
			kind := globExact
			switch {
			case lead && trail:
				kind = globContains
			case lead:
				kind = globSuffix
			case trail:
				kind = globPrefix
			}
			return glob{kind: kind, lit: inner, litb: []byte(inner)}
		}
		parts := strings.Split(p, "*")
		g := glob{kind: globSegments, pat: p, first: parts[0], last: parts[len(parts)-1]}
		for _, m := range parts[1 : len(parts)-1] {
			g.mid = append(g.mid, []byte(m))
		}
		return g
	}
	return glob{kind: globGeneral, pat: p}
}

// collapseStars replaces each run of '*' with one: they match the same.
func collapseStars(p string) string {
	if !strings.Contains(p, "**") {
		return p
	}
	b := make([]byte, 0, len(p))
	for i := 0; i < len(p); i++ {
		if p[i] == '*' && len(b) > 0 && b[len(b)-1] == '*' {
			continue
		}
		b = append(b, p[i])
	}
	return string(b)
}

// match reports whether s matches the glob.
func (g *glob) match(s []byte) bool {
	switch g.kind {
	case globAny:
		return true
	case globExact:
		return string(s) == g.lit
	case globPrefix:
		return len(s) >= len(g.lit) && string(s[:len(g.lit)]) == g.lit
	case globSuffix:
		return len(s) >= len(g.lit) && string(s[len(s)-len(g.lit):]) == g.lit
	case globContains:
		return bytes.Contains(s, g.litb)
	case globSegments:
		return g.matchSegments(s)
	case globRegexp:
		return g.re.Match(s)
	}
	return matchGeneral(g.pat, s)
}

// matchSegments matches a pattern of literals separated by stars: the
// first literal must start s, the last end it, and the middle ones appear
// in order in between. Taking each middle literal's leftmost occurrence
// is optimal, so no backtracking is needed.
func (g *glob) matchSegments(s []byte) bool {
	if len(s) < len(g.first)+len(g.last) ||
		string(s[:len(g.first)]) != g.first || string(s[len(s)-len(g.last):]) != g.last {
		return false
	}
	s = s[len(g.first) : len(s)-len(g.last)]
	for _, m := range g.mid {
		i := bytes.Index(s, m)
		if i < 0 {
			return false
		}
		s = s[i+len(m):]
	}
	return true
}

// matchGeneral matches s against p by the classic two-pointer method:
// on a mismatch, go back to the last '*' and let it swallow one more byte.
// It runs in O(len(p)·len(s)) at worst and allocates nothing.
func matchGeneral(p string, s []byte) bool {
	pi, si := 0, 0
	star, mark := -1, 0 // index of the last '*' in p, and where in s it began
	for si < len(s) {
		switch {
		case pi < len(p) && p[pi] == '*':
			star, mark = pi, si
			pi++
		case pi < len(p) && (p[pi] == '?' || p[pi] == s[si]):
			pi++
			si++
		case star >= 0:
			mark++
			pi, si = star+1, mark
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// String returns the glob's pattern, stars collapsed.
func (g *glob) String() string {
	switch g.kind {
	case globAny:
		return "*"
	case globExact:
		return g.lit
	case globPrefix:
		return g.lit + "*"
	case globSuffix:
		return "*" + g.lit
	case globContains:
		return "*" + g.lit + "*"
	}
	return g.pat // globSegments, globGeneral, globRegexp
}
