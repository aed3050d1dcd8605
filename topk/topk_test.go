package topk_test

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/rld/rld/topk"
)

// TestHeavyHittersAlwaysHeld checks Space-Saving's guarantee on skewed
// and adversarial streams: every key added more than N/k times is held,
// and every held count brackets the true count (Count−Error ≤ true ≤
// Count, Error ≤ N/k).
func TestHeavyHittersAlwaysHeld(t *testing.T) {
	const k = 16
	streams := map[string]func(r *rand.Rand) []string{
		// A few hot keys in a crowd of one-off keys.
		"hot in a crowd": func(r *rand.Rand) []string {
			var s []string
			for i := range 20000 {
				switch {
				case r.IntN(10) == 0:
					s = append(s, "hot-a")
				case r.IntN(20) == 0:
					s = append(s, "hot-b")
				default:
					s = append(s, "cold-"+strconv.Itoa(i))
				}
			}
			return s
		},
		// Zipf-distributed keys.
		"zipf": func(r *rand.Rand) []string {
			z := rand.NewZipf(r, 1.2, 1, 5000)
			s := make([]string, 30000)
			for i := range s {
				s[i] = "z" + strconv.FormatUint(z.Uint64(), 10)
			}
			return s
		},
		// The heavy key arrives last, after the counters filled up with
		// others: it must still be found.
		"late heavy key": func(*rand.Rand) []string {
			var s []string
			for i := range 1000 {
				s = append(s, "early-"+strconv.Itoa(i%50))
			}
			for range 300 {
				s = append(s, "late")
			}
			return s
		},
	}
	for name, gen := range streams {
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			stream := gen(r)
			sk := topk.New(k)
			truth := map[string]uint64{}
			for _, key := range stream {
				sk.Add([]byte(key))
				truth[key]++
			}
			top, total := sk.Top(0)
			if total != uint64(len(stream)) {
				t.Fatalf("total = %d, want %d", total, len(stream))
			}
			if len(top) > k || sk.Len() > k {
				t.Fatalf("holds %d keys, more than k=%d", len(top), k)
			}
			held := map[string]topk.Entry{}
			for _, e := range top {
				held[e.Key] = e
				tr := truth[e.Key]
				if e.Count < tr || e.Count-e.Error > tr || e.Error > total/k {
					t.Errorf("%s: count %d error %d, true %d, N/k %d", e.Key, e.Count, e.Error, tr, total/k)
				}
			}
			for key, n := range truth {
				if n > total/k {
					if _, ok := held[key]; !ok {
						t.Errorf("%s added %d times > N/k = %d, not held", key, n, total/k)
					}
				}
			}
		})
	}
}

// TestMemoryBounded adds a million distinct keys to a small sketch: it
// holds k of them, and adding a held key allocates nothing.
func TestMemoryBounded(t *testing.T) {
	sk := topk.New(8)
	for i := range 1_000_000 {
		sk.Add([]byte(fmt.Sprint(i % 100_000)))
	}
	if n := sk.Len(); n != 8 {
		t.Fatalf("holds %d keys, want 8", n)
	}
	top, _ := sk.Top(1)
	key := []byte(top[0].Key)
	if a := testing.AllocsPerRun(1000, func() { sk.Add(key) }); a != 0 {
		t.Fatalf("Add of a held key allocates %v times", a)
	}
	long := []byte("a-long-key-that-no-slot-has-held-yet-0123456789")
	sk.Add(long) // the slot's buffer grows once
	if a := testing.AllocsPerRun(1000, func() { sk.Add(long); sk.Add(key) }); a != 0 {
		t.Fatalf("Add of keys seen before allocates %v times", a)
	}
}

func TestTopOrderAndLimit(t *testing.T) {
	sk := topk.New(4)
	for i, n := range []int{5, 3, 9} {
		for range n {
			sk.Add([]byte{'a' + byte(i)})
		}
	}
	top, total := sk.Top(2)
	if total != 17 || len(top) != 2 || top[0].Key != "c" || top[0].Count != 9 || top[1].Key != "a" {
		t.Fatalf("Top(2) = %+v, total %d", top, total)
	}
}

func BenchmarkAddHeld(b *testing.B) {
	sk := topk.New(64)
	key := []byte("api_key=sk_abuser")
	b.ReportAllocs()
	for b.Loop() {
		sk.Add(key)
	}
}
