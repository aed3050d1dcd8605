package admin_test

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/rld/rld/admin"
)

// FuzzParsePairs: ParsePairs never panics, and what it reads writes
// back (Pairs.String) as text it reads the same, unless a value holds
// ",name=" (which needs the object form).
func FuzzParsePairs(f *testing.F) {
	for _, s := range []string{"api_key=k", "a=1,b=2", "ip=a,b", "=", ",", "a=1,a=2", "a==b,c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := admin.ParsePairs(s)
		if err != nil {
			return
		}
		for _, v := range p {
			if strings.Contains(v, ",") {
				return
			}
		}
		back, err := admin.ParsePairs(p.String())
		if err != nil || !reflect.DeepEqual(back, p) {
			t.Fatalf("%q: %v writes as %q, reads back as %v, %v", s, p, p.String(), back, err)
		}
	})
}

// FuzzServe: any request body gets an answer, never a panic, and a
// request refused before its op ran reaches no service.
func FuzzServe(f *testing.F) {
	for _, s := range []string{
		`{"op":"reset","args":{"rule":"r","key":"api_key=k"}}`,
		`{"op":"block","args":{"rule":"r","key":{"api_key":"k"},"ttl":"1h"}}`,
		`{"op":"explain","args":{"descriptors":{"ip":"1"}}}`,
		`{"op":"explain","args":{"descriptors":[{"name":"ip","value":"1"}]}}`,
		`{"op":"list","args":{"cursor":"o-01","limit":5}}`,
		`{"op":"grant","args":{"descriptors":{"a":"1","a":"2"},"n":1}}`,
	} {
		f.Add([]byte(s))
	}
	s := &admin.Server{Service: &formsFake{}}
	f.Fuzz(func(t *testing.T, body []byte) {
		r := s.Serve(context.Background(), admin.Caller{Face: "socket", Role: admin.RoleWrite}, body)
		if r.Err == nil && r.Result == nil {
			t.Fatalf("%q: neither a result nor an error", body)
		}
	})
}
