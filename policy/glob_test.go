package policy

import (
	"strings"
	"testing"
)

func TestGlob(t *testing.T) {
	tests := []struct {
		pattern string
		kind    globKind
		yes     []string
		no      []string
	}{
		{"*", globAny, []string{"", "a", "/v1/search/x"}, nil},
		{"**", globAny, []string{"", "abc"}, nil},
		{"/v1/login", globExact, []string{"/v1/login"}, []string{"", "/v1/login/", "/v1/logi", "/V1/login"}},
		{"", globExact, []string{""}, []string{"a"}},
		{"/v1/search*", globPrefix, []string{"/v1/search", "/v1/search/", "/v1/search?q=1", "/v1/searches/a/b"}, []string{"/v1/searc", "/v2/search", ""}},
		{"sk_internal_*", globPrefix, []string{"sk_internal_", "sk_internal_abc"}, []string{"sk_internal", "xsk_internal_a"}},
		{"*.example.com", globSuffix, []string{".example.com", "a.b.example.com"}, []string{"example.com", "a.example.com.", ""}},
		{"*admin*", globContains, []string{"admin", "/v1/admin/x", "xadminx"}, []string{"adm", "ADMIN", ""}},
		{"a**b", globSegments, []string{"ab", "axxb", "a/b"}, []string{"a", "b", "ba", "abx"}},
		{"/v1/*/items", globSegments, []string{"/v1/x/items", "/v1//items", "/v1/a/b/items"}, []string{"/v1/items", "/v1/x/items/"}},
		{"?", globGeneral, []string{"a", "/", "\xff"}, []string{"", "ab"}},
		{"10.0.0.?", globGeneral, []string{"10.0.0.1", "10.0.0.9"}, []string{"10.0.0.10", "10.0.0."}},
		{"*?", globGeneral, []string{"a", "abc"}, []string{""}},
		{"?*?", globGeneral, []string{"ab", "abc"}, []string{"a", ""}},
		{"a*b*c", globSegments, []string{"abc", "aXbYc", "abbbc", "acbc", "abcbc"}, []string{"ab", "acb", "abcx", "bac"}},
		{"*a*a*a*b", globSegments, []string{"aaab", "xaxaxaxb", "aaaaaaaab"}, []string{"aab", "aaaa", strings.Repeat("a", 100)}},
		{"*a*b*", globSegments, []string{"ab", "xaybz", "aab"}, []string{"ba", "a", ""}},
		{"x*?y", globGeneral, []string{"xay", "xaaay"}, []string{"xy", "xa"}},
	}
	for _, tt := range tests {
		g := compileWildcards(tt.pattern)
		if g.kind != tt.kind {
			t.Errorf("compileWildcards(%q).kind = %d, want %d", tt.pattern, g.kind, tt.kind)
		}
		for _, s := range tt.yes {
			if !g.match([]byte(s)) {
				t.Errorf("glob %q does not match %q", tt.pattern, s)
			}
		}
		for _, s := range tt.no {
			if g.match([]byte(s)) {
				t.Errorf("glob %q matches %q", tt.pattern, s)
			}
		}
	}
}

// TestGlobAgainstReference checks every matcher kind against a simple
// recursive definition over many short patterns and inputs.
func TestGlobAgainstReference(t *testing.T) {
	var ref func(p, s string) bool
	ref = func(p, s string) bool {
		if p == "" {
			return s == ""
		}
		switch p[0] {
		case '*':
			return ref(p[1:], s) || s != "" && ref(p, s[1:])
		case '?':
			return s != "" && ref(p[1:], s[1:])
		}
		return s != "" && s[0] == p[0] && ref(p[1:], s[1:])
	}
	alphabet := []string{"a", "b", "*", "?"}
	kinds := map[globKind]int{}
	var patterns []string
	var gen func(prefix string, n int)
	gen = func(prefix string, n int) {
		patterns = append(patterns, prefix)
		if n == 0 {
			return
		}
		for _, c := range alphabet {
			gen(prefix+c, n-1)
		}
	}
	gen("", 4)
	var inputs []string
	var genIn func(prefix string, n int)
	genIn = func(prefix string, n int) {
		inputs = append(inputs, prefix)
		if n == 0 {
			return
		}
		genIn(prefix+"a", n-1)
		genIn(prefix+"b", n-1)
	}
	genIn("", 5)
	for _, p := range patterns {
		g := compileWildcards(p)
		kinds[g.kind]++
		for _, s := range inputs {
			if got, want := g.match([]byte(s)), ref(p, s); got != want {
				t.Fatalf("glob %q (kind %d) on %q = %v, want %v", p, g.kind, s, got, want)
			}
		}
	}
	for k := globAny; k <= globGeneral; k++ {
		if kinds[k] == 0 {
			t.Errorf("no pattern of kind %d generated", k)
		}
	}
}

func TestGlobDoesNotAllocate(t *testing.T) {
	globs := []glob{compileWildcards("*"), compileWildcards("/v1/x"), compileWildcards("/v1/*"), compileWildcards("*.com"), compileWildcards("*min*"), compileWildcards("/v?/*/y")}
	v := []byte("/v1/admin/y")
	allocs := testing.AllocsPerRun(100, func() {
		for i := range globs {
			globs[i].match(v)
		}
	})
	if allocs != 0 {
		t.Errorf("match allocates %v times", allocs)
	}
}

func BenchmarkGlob(b *testing.B) {
	v := []byte("/v1/search/items?q=shoes")
	for _, p := range []string{"/v1/search*", "*shoes", "/v1/*/items*", "~/v1/search/.*", "~/v1/(search|find)/[a-z]+\\?q=.*"} {
		g, err := compileGlob(p)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(p, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				g.match(v)
			}
		})
	}
}

// TestGlobRegexp: a pattern starting with '~' is a regular expression
// anchored at both ends, whatever anchors it writes itself.
func TestGlobRegexp(t *testing.T) {
	tests := []struct {
		pattern string
		yes, no []string
	}{
		{"~/v1/orders/[0-9]+", []string{"/v1/orders/1", "/v1/orders/12345"}, []string{"/v1/orders/", "/v1/orders/1a", "x/v1/orders/1", "/v1/orders/1/items"}},
		// An alternation is anchored as a whole, not only its ends.
		{"~a|b", []string{"a", "b"}, []string{"ab", "xa", "bx", ""}},
		{"~^/v[12]/.*$", []string{"/v1/", "/v2/x"}, []string{"/v3/x", "x/v1/"}},
		{"~.*", []string{"", "anything"}, nil},
		// The rest after '~' is the regexp: "*" and "?" are its own.
		{"~ab?c*", []string{"a", "ab", "abccc", "ac"}, []string{"abb", "x"}},
		{"~(?i)sk_LIVE_\\w+", []string{"SK_live_1", "sk_live_abc"}, []string{"sk_test_1"}},
	}
	for _, tt := range tests {
		g, err := compileGlob(tt.pattern)
		if err != nil {
			t.Fatalf("compileGlob(%q): %v", tt.pattern, err)
		}
		if g.kind != globRegexp || g.String() != tt.pattern {
			t.Errorf("compileGlob(%q): kind %d, String %q", tt.pattern, g.kind, g.String())
		}
		for _, s := range tt.yes {
			if !g.match([]byte(s)) {
				t.Errorf("%q does not match %q", tt.pattern, s)
			}
		}
		for _, s := range tt.no {
			if g.match([]byte(s)) {
				t.Errorf("%q matches %q", tt.pattern, s)
			}
		}
	}
	for _, bad := range []string{"~", "~(", "~[z-a]", "~a{2000}", "~x)(?:y", "~a)|(b"} {
		if _, err := compileGlob(bad); err == nil {
			t.Errorf("compileGlob(%q) accepted an invalid regular expression", bad)
		}
	}
	// A '~' anywhere else is a literal byte of a glob.
	g, err := compileGlob("/home/~user*")
	if err != nil || g.kind != globPrefix || !g.match([]byte("/home/~user/x")) {
		t.Errorf("compileGlob(\"/home/~user*\") = kind %d, %v", g.kind, err)
	}
}

// TestGlobRegexpDoesNotAllocate: matching a regexp reuses its machines,
// so a warm match allocates nothing, on a match and on a miss.
func TestGlobRegexpDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("under -race, sync.Pool drops the regexps' machines at random")
	}
	var globs []glob
	for _, p := range []string{"~/v1/orders/[0-9]+", "~/v1/(search|find)/[a-z]+\\?q=.*", "~(?i).*ADMIN.*", "~[a-f0-9]{8}-[a-f0-9]{4}"} {
		g, err := compileGlob(p)
		if err != nil {
			t.Fatal(err)
		}
		globs = append(globs, g)
	}
	values := [][]byte{[]byte("/v1/orders/12345"), []byte("/v1/search/items?q=shoes"), []byte("/v1/admin/y"), []byte("deadbeef-0123"), []byte("nothing")}
	allocs := testing.AllocsPerRun(1000, func() {
		for i := range globs {
			for _, v := range values {
				globs[i].match(v)
			}
		}
	})
	if allocs != 0 {
		t.Errorf("regexp match allocates %v times", allocs)
	}
}
