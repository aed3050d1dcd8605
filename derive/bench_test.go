package derive_test

import (
	"testing"
	"time"

	"github.com/rld/rld/derive"
	"github.com/rld/rld/descriptor"
	"github.com/rld/rld/internal/reqcorpus"
)

// BenchmarkDerive measures one request's derivation under the corpus's
// configuration: a typical request (peer, method, host, target, an API
// key), one through a trusted proxy, and one with a verified JWT.
func BenchmarkDerive(b *testing.B) {
	d := corpusDeriver(b)
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	cases := map[string]reqcorpus.Case{
		"typical": {Peer: "203.0.113.7", Method: "GET", Host: "api.example.com", Target: "/v1/search?q=rate+limits&page=2",
			Headers: []reqcorpus.Header{{Name: "X-API-Key", Value: "sk_live_0123456789abcdef"}}},
		"proxied": {Peer: "127.0.0.5", Method: "POST", Host: "api.example.com", Target: "/v1/orders/12345",
			Headers: []reqcorpus.Header{{Name: "X-API-Key", Value: "sk_live_0123456789abcdef"}, {Name: "X-Forwarded-For", Value: "198.51.100.7, 10.1.2.3"}}},
		"jwt": {Peer: "203.0.113.7", Method: "GET", Host: "api.example.com", Target: "/v1/search",
			Headers: []reqcorpus.Header{{Name: "Authorization", Value: "Bearer eyJhbGciOiJFZERTQSIsImtpZCI6ImNvcnB1cy0xIiwidHlwIjoiSldUIn0.eyJleHAiOjQxMDI0NDQ4MDAsInN1YiI6ImFsaWNlIiwidGVuYW50IjoiYWNtZSJ9.eGAVvK28JNZJwc0zX9XA0twtFwJG3cdIZrytSAe-6bLyJLpcbFAZXJREu0wlpuIxMOwesU9hYjMOFkKeNnT2Dg"}}},
	}
	for _, name := range []string{"typical", "proxied", "jwt"} {
		c := cases[name]
		in := c.Attributes()
		b.Run(name, func(b *testing.B) {
			var s derive.Scratch
			d.Derive(in, now, &s)
			b.ReportAllocs()
			for b.Loop() {
				d.Derive(in, now, &s)
			}
		})
	}
	b.Run("no-attributes", func(b *testing.B) {
		in := []descriptor.Descriptor{{Name: []byte("api_key"), Value: []byte("k1")}, {Name: []byte("endpoint"), Value: []byte("/v1/search")}}
		var s derive.Scratch
		b.ReportAllocs()
		for b.Loop() {
			d.Derive(in, now, &s)
		}
	})
}
