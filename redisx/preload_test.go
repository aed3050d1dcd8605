package redisx_test

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/lua"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/redisx"
)

// TestScriptsPreloaded: every check script (each algorithm's and its once
// variant) is loaded on Redis once the client connects, before any call,
// also when Redis comes up after the client started; and on each primary
// of a Cluster.
func TestScriptsPreloaded(t *testing.T) {
	var shas []string
	for k := range algo.NumKinds {
		for _, get := range []func(string) (string, bool){lua.Source, lua.OnceSource} {
			src, _ := get(algo.Kind(k).String())
			sum := sha1.Sum([]byte(src))
			shas = append(shas, hex.EncodeToString(sum[:]))
		}
	}
	loaded := func(addr string) bool {
		r, err := redistest.Do(addr, append([]string{"SCRIPT", "EXISTS"}, shas...)...)
		return err == nil && r == strings.TrimSuffix(strings.Repeat("1\n", len(shas)), "\n")
	}

	srv := redistest.Standalone(t)
	newClient(t, redisx.Options{Addrs: []string{srv.Addr}})
	redistest.WaitFor(t, "the scripts on a running Redis", func() bool { return loaded(srv.Addr) })

	late := redistest.Standalone(t)
	late.Kill()
	newClient(t, redisx.Options{Addrs: []string{late.Addr}})
	late.Start(t)
	redistest.WaitFor(t, "the scripts on a Redis started later", func() bool { return loaded(late.Addr) })

	cl := redistest.StartCluster(t)
	newClient(t, redisx.Options{Addrs: cl.Addrs()[:1], Mode: redisx.Cluster})
	for _, p := range cl.Primaries() {
		redistest.WaitFor(t, fmt.Sprintf("the scripts on primary %s", p.Addr), func() bool { return loaded(p.Addr) })
	}
}
