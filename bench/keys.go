package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// maxKeys bounds -keys: a Zipf key space keeps 8 bytes per key.
const maxKeys = 10_000_000

// Key distributions (-dist).
const (
	distHot     = "hot"     // every request on key 0
	distUniform = "uniform" // key numbers uniform over 0 … keys-1
	distZipf    = "zipf"    // key number k with probability ∝ 1/(k+1)^s
)

// keySpace draws the key number of each request. It is read-only once
// made, so every connection shares one; each draws with its own
// *rand.Rand.
type keySpace struct {
	dist string
	n    int     // number of keys
	s    float64 // Zipf exponent
	// cdf[k] is the probability of a key number ≤ k (Zipf only); its
	// last entry is exactly 1.
	cdf []float64
}

// newKeySpace returns the distribution dist over n keys; s is the Zipf
// exponent, any s > 0 (s ≤ 1 included, unlike math/rand's Zipf).
func newKeySpace(dist string, n int, s float64) (*keySpace, error) {
	if n < 1 || n > maxKeys {
		return nil, fmt.Errorf("-keys=%d: want 1 to %d", n, maxKeys)
	}
	k := &keySpace{dist: dist, n: n, s: s}
	switch dist {
	case distHot:
		k.n = 1
	case distUniform:
	case distZipf:
		if !(s > 0) || math.IsInf(s, 0) {
			return nil, fmt.Errorf("-zipf=%v: want an exponent above 0", s)
		}
		k.cdf = make([]float64, n)
		sum := 0.0
		for i := range k.cdf {
			sum += math.Pow(float64(i+1), -s)
			k.cdf[i] = sum
		}
		for i := range k.cdf {
			k.cdf[i] /= sum
		}
		k.cdf[n-1] = 1
	default:
		return nil, fmt.Errorf("-dist=%q: want %s, %s or %s", dist, distHot, distUniform, distZipf)
	}
	return k, nil
}

// pick returns a key number in 0 … n-1. It does not allocate.
func (k *keySpace) pick(r *rand.Rand) int {
	switch {
	case k.n == 1:
		return 0
	case k.cdf != nil:
		i, _ := slices.BinarySearch(k.cdf, r.Float64())
		return min(i, k.n-1)
	default:
		return r.IntN(k.n)
	}
}

// String describes the distribution, e.g. "zipf(s=1.1) over 10000 keys".
func (k *keySpace) String() string {
	switch k.dist {
	case distHot:
		return "one hot key"
	case distZipf:
		return fmt.Sprintf("zipf(s=%g) over %d keys", k.s, k.n)
	}
	return fmt.Sprintf("uniform over %d keys", k.n)
}
