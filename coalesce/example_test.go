package coalesce_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/rld/rld/coalesce"
)

// ExampleGroup batches checks of a counter: each request is a cost, each
// response the count after it. The run function stands for one round trip
// to a shared store; concurrent checks of one key share a round trip.
func ExampleGroup() {
	var (
		mu     sync.Mutex // runs for different keys may overlap
		counts = map[string]int64{}
	)
	take := func(key string, costs []int64, out []int64) error {
		mu.Lock()
		defer mu.Unlock()
		for i, c := range costs {
			counts[key] += c
			out[i] = counts[key]
		}
		return nil
	}
	g := coalesce.New(take, coalesce.Options{})

	ctx := context.Background()
	key := []byte("tenant:acme")
	for _, cost := range []int64{1, 5, 2} {
		n, err := g.Do(ctx, key, cost)
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		fmt.Printf("cost %d: count %d\n", cost, n)
	}
	s := g.Stats()
	fmt.Printf("%d requests in %d batches\n", s.Requests, s.Batches)
	// Output:
	// cost 1: count 1
	// cost 5: count 6
	// cost 2: count 8
	// 3 requests in 3 batches
}
