package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/config"
	"github.com/rld/rld/daemon"
	"github.com/rld/rld/descriptor"
	"github.com/rld/rld/header"
	"github.com/rld/rld/header/wireheader"
	"github.com/rld/rld/memstore"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/wire"
)

// sfItem is one member of an RFC 9651 List: a bare item (int64, string
// for an sf-string, sfToken for a token, bool) and its parameters.
type sfItem struct {
	value  any
	params map[string]any
}

// sfToken is an RFC 9651 token.
type sfToken string

// parseSFList parses s as an RFC 9651 List of Items, strictly, for the
// subset the rate-limit fields use: integers, sf-strings, tokens and
// booleans, with parameters. Inner lists and other bare items are errors,
// as is a parameter given twice.
func parseSFList(s string) ([]sfItem, error) {
	p := &sfParser{s: s}
	p.skipSP()
	var out []sfItem
	for {
		if p.eof() {
			return nil, errors.New("empty list or trailing comma")
		}
		v, err := p.bareItem()
		if err != nil {
			return nil, err
		}
		it := sfItem{value: v, params: map[string]any{}}
		for !p.eof() && p.peek() == ';' {
			p.i++
			p.skipSP()
			k, err := p.key()
			if err != nil {
				return nil, err
			}
			var pv any = true
			if !p.eof() && p.peek() == '=' {
				p.i++
				if pv, err = p.bareItem(); err != nil {
					return nil, err
				}
			}
			if _, dup := it.params[k]; dup {
				return nil, fmt.Errorf("parameter %q given twice", k)
			}
			it.params[k] = pv
		}
		out = append(out, it)
		p.skipOWS()
		if p.eof() {
			return out, nil
		}
		if p.peek() != ',' {
			return nil, fmt.Errorf("at %d: want ',' got %q", p.i, p.peek())
		}
		p.i++
		p.skipOWS()
	}
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) eof() bool  { return p.i >= len(p.s) }
func (p *sfParser) peek() byte { return p.s[p.i] }
func (p *sfParser) skipSP() {
	for !p.eof() && p.peek() == ' ' {
		p.i++
	}
}
func (p *sfParser) skipOWS() {
	for !p.eof() && (p.peek() == ' ' || p.peek() == '\t') {
		p.i++
	}
}

func isLCAlpha(c byte) bool { return c >= 'a' && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || c >= 'A' && c <= 'Z' }
func isDigit(c byte) bool   { return c >= '0' && c <= '9' }

// isTChar reports whether c is an RFC 9110 tchar.
func isTChar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func (p *sfParser) key() (string, error) {
	start := p.i
	if p.eof() || !(isLCAlpha(p.peek()) || p.peek() == '*') {
		return "", fmt.Errorf("at %d: bad key start", p.i)
	}
	for !p.eof() {
		c := p.peek()
		if !(isLCAlpha(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*') {
			break
		}
		p.i++
	}
	return p.s[start:p.i], nil
}

func (p *sfParser) bareItem() (any, error) {
	if p.eof() {
		return nil, errors.New("missing bare item")
	}
	switch c := p.peek(); {
	case c == '-' || isDigit(c):
		start := p.i
		if c == '-' {
			p.i++
		}
		digits := p.i
		for !p.eof() && isDigit(p.peek()) {
			p.i++
		}
		if p.i == digits || p.i-digits > 15 {
			return nil, fmt.Errorf("at %d: bad integer", start)
		}
		if !p.eof() && p.peek() == '.' {
			return nil, fmt.Errorf("at %d: decimals are not used here", start)
		}
		return strconv.ParseInt(p.s[start:p.i], 10, 64)
	case c == '"':
		p.i++
		var b strings.Builder
		for {
			if p.eof() {
				return nil, errors.New("unterminated string")
			}
			c := p.peek()
			p.i++
			switch {
			case c == '"':
				return b.String(), nil
			case c == '\\':
				if p.eof() || (p.peek() != '"' && p.peek() != '\\') {
					return nil, fmt.Errorf("at %d: bad escape", p.i)
				}
				b.WriteByte(p.peek())
				p.i++
			case c < 0x20 || c > 0x7e:
				return nil, fmt.Errorf("at %d: byte %#x in a string", p.i-1, c)
			default:
				b.WriteByte(c)
			}
		}
	case isAlpha(c) || c == '*':
		start := p.i
		for !p.eof() && (isTChar(p.peek()) || p.peek() == ':' || p.peek() == '/') {
			p.i++
		}
		return sfToken(p.s[start:p.i]), nil
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return p.s[p.i-1] == '1', nil
		}
	}
	return nil, fmt.Errorf("at %d: unsupported bare item %q", p.i, p.s[p.i:])
}

func TestParseSFList(t *testing.T) {
	items, err := parseSFList(`"a\"b";q=3;w=60, tok;r=0;t=20;x, "c"`)
	require.NoError(t, err)
	require.Len(t, items, 3)
	assert.Equal(t, `a"b`, items[0].value)
	assert.Equal(t, map[string]any{"q": int64(3), "w": int64(60)}, items[0].params)
	assert.Equal(t, sfToken("tok"), items[1].value)
	assert.Equal(t, true, items[1].params["x"])
	for _, bad := range []string{``, `"a`, `"a";Q=1`, `"a";q=1;q=2`, `"a",`, `"a";q=1.5`, `"a" "b"`, `("a")`, `"a";q=`} {
		_, err := parseSFList(bad)
		assert.Error(t, err, "%q", bad)
	}
}

// rlFields is one answer's rate-limit fields, parsed.
type rlFields struct {
	q, w       int64 // RateLimit-Policy
	r, t       int64 // RateLimit; t is -1 when absent
	retryAfter int64 // -1 when absent
}

// parseRL parses the fields of one answer strictly: each IETF field is a
// list of one item, named rule, with the parameters the draft defines.
func parseRL(t *testing.T, rule string, get func(string) string) rlFields {
	t.Helper()
	f := rlFields{t: -1, retryAfter: -1}
	item := func(name string, allowed ...string) sfItem {
		t.Helper()
		items, err := parseSFList(get(name))
		require.NoError(t, err, "%s: %q", name, get(name))
		require.Len(t, items, 1, name)
		require.Equal(t, rule, items[0].value, "%s names the rule as an sf-string", name)
		for k, v := range items[0].params {
			require.Contains(t, allowed, k, "%s: parameter %s", name, k)
			n, ok := v.(int64)
			require.True(t, ok && n >= 0, "%s: %s=%v is a non-negative integer", name, k, v)
		}
		return items[0]
	}
	pol := item(header.Policy, "q", "w")
	f.q, f.w = pol.params["q"].(int64), pol.params["w"].(int64)
	require.Positive(t, f.q, "q")
	require.Positive(t, f.w, "w")
	rl := item(header.RateLimit, "r", "t")
	var ok bool
	f.r, ok = rl.params["r"].(int64)
	require.True(t, ok, "r is required")
	if v, ok := rl.params["t"]; ok {
		f.t = v.(int64)
	}
	if v := get(header.RetryAfter); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		require.NoError(t, err, "Retry-After %q", v)
		f.retryAfter = n
	}
	return f
}

// headerAlgos are the limits the header tests cover: every algorithm, the
// bucket ones with a burst above the sustained limit.
var headerAlgos = []struct{ algo, extra string }{
	{"token_bucket", "burst = 5"},
	{"gcra", "burst = 5"},
	{"sliding_log", ""},
	{"sliding_counter", ""},
	{"fixed_window", ""},
}

// sustained is the q of the limit of headerRule: 3 per minute, but 2 for
// the sliding counter, which refuses a client paced at exactly its limit
// (see algo.Sustained).
func sustained(alg string) int64 {
	if alg == "sliding_counter" {
		return 2
	}
	return 3
}

func headerRule(alg, extra string) string {
	return fmt.Sprintf("[[rule]]\nname = \"r\"\nby = [\"k\"]\nalgorithm = %q\nlimit = 3\nperiod = \"1m\"\n%s\n", alg, extra)
}

// TestRateLimitFieldsGuideClients follows the IETF fields the way a
// client would, on the daemon's rendering of policy decisions made at
// explicit times: a client pacing itself at q per w is never refused, and
// a limited client that waits t is admitted, t being no later than
// Retry-After; while allowed, no more than r units come within t.
func TestRateLimitFieldsGuideClients(t *testing.T) {
	for _, a := range headerAlgos {
		t.Run(a.algo, func(t *testing.T) {
			cfg, err := config.Parse([]byte(headerRule(a.algo, a.extra)), "rld.toml")
			require.NoError(t, err)
			p, err := policy.New(cfg, memstore.New(memstore.Options{}))
			require.NoError(t, err)
			ctx := context.Background()
			check := func(key string, now time.Time, peek bool) (policy.Decision, rlFields) {
				t.Helper()
				dec := p.Check(ctx, &policy.Request{Now: now, Descs: []descriptor.Descriptor{{Name: []byte("k"), Value: []byte(key)}}, Cost: 1, Peek: peek}, nil)
				fields, _ := header.AppendFields(nil, nil, daemon.AnswerOf(&dec), now)
				get := func(name string) string {
					for _, f := range fields {
						if f.Name == name {
							return string(f.Value)
						}
					}
					return ""
				}
				return dec, parseRL(t, "r", get)
			}
			start := time.Unix(1_700_000_007, 123_456_789)

			// A client that paces itself at q per w.
			_, f := check("pacer", start, true)
			assert.Equal(t, sustained(a.algo), f.q, "q is the sustained limit, not the burst")
			assert.Equal(t, int64(60), f.w)
			step := time.Duration(f.w) * time.Second / time.Duration(f.q)
			for i := range 5 * f.q {
				now := start.Add(time.Duration(i) * step)
				dec, _ := check("pacer", now, false)
				require.Equal(t, policy.StatusAllowed, dec.Status, "paced request %d at +%s refused", i, now.Sub(start))
			}

			// A client that goes as fast as it is let, then waits t.
			now := start
			waits := 0
			for i := 0; waits < 12; i++ {
				require.Less(t, i, 1000, "never limited")
				dec, f := check("greedy", now, false)
				if dec.Status == policy.StatusAllowed {
					if f.t >= 1 && f.r > 0 {
						// Within t no more than r: just before t the
						// quota has not grown.
						_, later := check("greedy", now.Add(time.Duration(f.t-1)*time.Second), true)
						assert.LessOrEqual(t, later.r, f.r, "more than r=%d within t=%d", f.r, f.t)
					}
					now = now.Add(time.Millisecond)
					continue
				}
				require.Equal(t, policy.StatusLimited, dec.Status)
				require.Equal(t, int64(0), f.r)
				require.GreaterOrEqual(t, f.t, int64(1), "a limited answer says when quota comes back")
				require.LessOrEqual(t, f.t, f.retryAfter, "t=%d later than Retry-After=%d", f.t, f.retryAfter)
				now = now.Add(time.Duration(f.t) * time.Second)
				dec, _ = check("greedy", now, true)
				require.Equal(t, policy.StatusAllowed, dec.Status, "refused after waiting t=%d", f.t)
				waits++
			}
		})
	}
}

// TestRateLimitFieldsOverHTTP checks the fields a real daemon sends, for
// every algorithm, allowed and limited: RateLimit-Policy advertises the
// sustained limit per period, and a limited answer's t is never later
// than its Retry-After.
func TestRateLimitFieldsOverHTTP(t *testing.T) {
	for _, a := range headerAlgos {
		t.Run(a.algo, func(t *testing.T) {
			s := start(t, headerRule(a.algo, a.extra))
			limited := false
			for i := 0; !limited; i++ {
				require.Less(t, i, 100, "never limited")
				resp, err := http.Get("http://" + s.HTTP + "/v1/check?k=x")
				require.NoError(t, err)
				resp.Body.Close()
				f := parseRL(t, "r", resp.Header.Get)
				assert.Equal(t, sustained(a.algo), f.q, "q")
				assert.Equal(t, int64(60), f.w, "w")
				switch resp.StatusCode {
				case http.StatusOK:
					assert.Equal(t, int64(-1), f.retryAfter)
				case http.StatusTooManyRequests:
					limited = true
					assert.Equal(t, int64(0), f.r)
					require.GreaterOrEqual(t, f.t, int64(1))
					assert.LessOrEqual(t, f.t, f.retryAfter)
				default:
					t.Fatalf("status %d", resp.StatusCode)
				}
			}
		})
	}
}

// TestFrameCarriesTheHTTPFields checks, for every algorithm, allowed and
// limited, that the fields a client renders from the response frame are
// the fields the HTTP endpoint renders for the same decision: the frame
// is filled from the same answer, and header.FromResponse reads it back.
// Times are whole milliseconds, as the frame's are, so even
// X-RateLimit-Reset (a point in time) is the same.
func TestFrameCarriesTheHTTPFields(t *testing.T) {
	for _, a := range headerAlgos {
		t.Run(a.algo, func(t *testing.T) {
			cfg, err := config.Parse([]byte(headerRule(a.algo, a.extra)), "rld.toml")
			require.NoError(t, err)
			p, err := policy.New(cfg, memstore.New(memstore.Options{}))
			require.NoError(t, err)
			render := func(a header.Answer, now time.Time) map[string]string {
				fields, _ := header.AppendFields(nil, nil, a, now)
				m := map[string]string{}
				for _, f := range fields {
					m[f.Name] = string(f.Value)
				}
				return m
			}
			start := time.Unix(1_700_000_007, 123_000_000)
			seen := map[policy.Status]bool{}
			var res wire.Response
			for i := range 40 {
				now := start.Add(time.Duration(i) * 1237 * time.Millisecond)
				dec := p.Check(context.Background(), &policy.Request{Now: now, Descs: []descriptor.Descriptor{{Name: []byte("k"), Value: []byte("x")}}, Cost: 1, Peek: i%5 == 4}, nil)
				seen[dec.Status] = true
				daemon.FillResponse(&res, &dec)
				var back wire.Response
				require.NoError(t, wire.DecodeResponse(wire.AppendResponse(nil, &res), &back))
				http := render(daemon.AnswerOf(&dec), now)
				frame := render(wireheader.FromResponse(&back), now)
				require.Equal(t, http, frame, "check %d at +%s (%s)", i, now.Sub(start), dec.Status)
				require.Contains(t, frame, header.Policy)
				assert.Equal(t, fmt.Sprintf(`"r";q=%d;w=60`, sustained(a.algo)), frame[header.Policy])
				if _, ok := frame[header.RetryAfter]; ok {
					assert.Contains(t, frame[header.RateLimit], ";t=", "a limited answer carries t")
				}
			}
			assert.True(t, seen[policy.StatusAllowed] && seen[policy.StatusLimited], "allowed and limited: %v", seen)
		})
	}
}

// TestFrameOfNoLimit checks what the frame says when no limit applied:
// quota 0 and next absent, so a client renders no field.
func TestFrameOfNoLimit(t *testing.T) {
	cfg, err := config.Parse([]byte(headerRule("token_bucket", "")), "rld.toml")
	require.NoError(t, err)
	p, err := policy.New(cfg, memstore.New(memstore.Options{}))
	require.NoError(t, err)
	dec := p.Check(context.Background(), &policy.Request{Now: time.Now(), Descs: []descriptor.Descriptor{{Name: []byte("other"), Value: []byte("x")}}, Cost: 1}, nil)
	var res wire.Response
	daemon.FillResponse(&res, &dec)
	assert.Equal(t, wire.StatusAllowed, res.Status)
	assert.Zero(t, res.Quota)
	assert.Zero(t, res.QuotaWindowMs)
	assert.Equal(t, wire.NextUnknown, res.NextMs)
	fields, _ := header.AppendFields(nil, nil, wireheader.FromResponse(&res), time.Now())
	assert.Empty(t, fields)
}
