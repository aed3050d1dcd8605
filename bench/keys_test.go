package main

import (
	"math"
	"math/rand/v2"
	"testing"
)

// draw returns how often each key number came up in n draws.
func draw(t *testing.T, k *keySpace, n int) []int {
	t.Helper()
	r := rand.New(rand.NewPCG(1, 2))
	counts := make([]int, k.n)
	for range n {
		i := k.pick(r)
		if i < 0 || i >= k.n {
			t.Fatalf("%s: key %d out of range", k, i)
		}
		counts[i]++
	}
	return counts
}

func TestHotKey(t *testing.T) {
	k, err := newKeySpace(distHot, 1000, 0)
	if err != nil {
		t.Fatal(err)
	}
	if c := draw(t, k, 1000); c[0] != 1000 {
		t.Errorf("hot: key 0 drawn %d times of 1000", c[0])
	}
}

func TestUniformKeys(t *testing.T) {
	const keys, n = 10, 100_000
	k, err := newKeySpace(distUniform, keys, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range draw(t, k, n) {
		if want := n / keys; c < want*9/10 || c > want*11/10 {
			t.Errorf("uniform: key %d drawn %d times, want about %d", i, c, want)
		}
	}
}

// TestZipfKeys: key k comes up in proportion to 1/(k+1)^s, for s above
// and below 1.
func TestZipfKeys(t *testing.T) {
	const keys, n = 1000, 400_000
	for _, s := range []float64{0.8, 1.1, 2} {
		k, err := newKeySpace(distZipf, keys, s)
		if err != nil {
			t.Fatal(err)
		}
		c := draw(t, k, n)
		norm := 0.0
		for i := range keys {
			norm += math.Pow(float64(i+1), -s)
		}
		for _, i := range []int{0, 1, 2, 9} {
			want := float64(n) * math.Pow(float64(i+1), -s) / norm
			if got := float64(c[i]); math.Abs(got-want) > 0.05*want+10 {
				t.Errorf("zipf(s=%g): key %d drawn %.0f times, want about %.0f", s, i, got, want)
			}
		}
		if c[0] <= c[1] || c[1] <= c[9] || c[9] <= c[500] {
			t.Errorf("zipf(s=%g): counts do not fall with the key: %d %d %d %d", s, c[0], c[1], c[9], c[500])
		}
	}
}

func TestKeySpaceErrors(t *testing.T) {
	for _, tc := range []struct {
		dist string
		n    int
		s    float64
	}{
		{"zipf", 10, 0}, {"zipf", 10, -1}, {"zipf", 10, math.Inf(1)}, {"uniform", 0, 0},
		{"uniform", maxKeys + 1, 0}, {"gauss", 10, 0},
	} {
		if _, err := newKeySpace(tc.dist, tc.n, tc.s); err == nil {
			t.Errorf("newKeySpace(%q, %d, %g): no error", tc.dist, tc.n, tc.s)
		}
	}
}

func TestPickDoesNotAllocate(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, dist := range []string{distHot, distUniform, distZipf} {
		k, err := newKeySpace(dist, 10_000, 1.1)
		if err != nil {
			t.Fatal(err)
		}
		if a := testing.AllocsPerRun(1000, func() { k.pick(r) }); a != 0 {
			t.Errorf("%s: %v allocations per pick", dist, a)
		}
	}
}
