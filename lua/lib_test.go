package lua

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/rld/rld/redistest"
)

// TestIntegerHelpers runs lib.lua's integer helpers in Redis on operands
// up to 2^53, many of them next to it or next to a multiple of the
// divisor, and compares them with Go's int64 arithmetic. It also checks
// two shortcuts the helpers do not rely on: math.floor(a/b), which is
// exact for all 0 ≤ a ≤ 2^53 and 1 ≤ b ≤ 2^53 (the rounded quotient never
// reaches the next integer), and the ceiling math.floor((a+b−1)/b), exact
// while a+b−1 < 2^53.
func TestIntegerHelpers(t *testing.T) {
	const top = int64(1) << 53
	rng := rand.New(rand.NewPCG(1, 2))
	var pairs [][2]int64
	add := func(a, b int64) {
		if a >= 0 && a <= top && b >= 1 && b <= top {
			pairs = append(pairs, [2]int64{a, b})
		}
	}
	for range 400 {
		b := []int64{1 + rng.Int64N(1000), 1 + rng.Int64N(1<<26), 1 + rng.Int64N(top), 1000, 1_000_000, 3, 7}[rng.IntN(7)]
		add(rng.Int64N(top+1), b)
		add(top-rng.Int64N(1000), b)
		n := rng.Int64N(top/b + 1)
		add(n*b, b)
		add(n*b-1, b)
		add(n*b+1, b)
		add(top/b*b-1, b)
	}
	add(top, 1)
	add(top, top)
	add(top-1, 3)
	add(0, 5)

	script, err := files.ReadFile("lib.lua")
	if err != nil {
		t.Fatal(err)
	}
	src := string(script) + `
local out = {}
for i = 1, #ARGV, 2 do
  local a, b = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  out[#out + 1] = int(quo(a, b))
  out[#out + 1] = int(ceil_div(a, b))
  out[#out + 1] = int(window_start(a, b))
  out[#out + 1] = int(math.floor(a / b))
  out[#out + 1] = int(quo(-a, b))
  out[#out + 1] = int(math.floor((a + b - 1) / b))
end
return out
`
	srv := redistest.Standalone(t)
	args := []string{"EVAL", src, "0"}
	for _, p := range pairs {
		args = append(args, strconv.FormatInt(p[0], 10), strconv.FormatInt(p[1], 10))
	}
	reply, err := redistest.Do(srv.Addr, args...)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(reply, "\n")
	if len(lines) != 6*len(pairs) {
		t.Fatalf("%d results for %d pairs", len(lines), len(pairs))
	}
	ceilInexact := 0
	for i, p := range pairs {
		a, b := p[0], p[1]
		got := make([]int64, 6)
		for j := range got {
			if got[j], err = strconv.ParseInt(lines[6*i+j], 10, 64); err != nil {
				t.Fatal(err)
			}
		}
		ceil := a / b
		if ceil*b != a {
			ceil++
		}
		if got[0] != a/b || got[1] != ceil || got[2] != a-a%b || got[4] != -a/b {
			t.Errorf("a=%d b=%d: quo %d, ceil_div %d, window_start %d, quo(-a) %d; want %d, %d, %d, %d",
				a, b, got[0], got[1], got[2], got[4], a/b, ceil, a-a%b, -a/b)
		}
		if got[3] != a/b {
			t.Errorf("a=%d b=%d: math.floor(a/b) = %d, want %d", a, b, got[3], a/b)
		}
		if got[5] != ceil {
			ceilInexact++
			if a+b-1 < top {
				t.Errorf("a=%d b=%d: math.floor((a+b-1)/b) = %d, want %d, with a+b-1 < 2^53", a, b, got[5], ceil)
			}
		}
	}
	t.Logf("%d pairs; math.floor((a+b-1)/b) was off in %d, all with a+b-1 ≥ 2^53", len(pairs), ceilInexact)
}
