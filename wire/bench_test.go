package wire_test

import (
	"testing"

	"github.com/rld/rld/wire"
)

// BenchmarkEncodeDecodeCheck encodes and decodes a typical CHECK request:
// what a client and the daemon do once per check.
func BenchmarkEncodeDecodeCheck(b *testing.B) {
	req := goldenRequest()
	got := wire.Request{Descs: make([]wire.Descriptor, 0, wire.MaxDescriptors)}
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		buf = wire.AppendRequest(buf[:0], &req)
		if err := wire.DecodeRequest(buf, &got); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(buf)))
}

// BenchmarkEncodeDecodeResponse encodes and decodes a typical answer.
func BenchmarkEncodeDecodeResponse(b *testing.B) {
	res := goldenResponse()
	var got wire.Response
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		buf = wire.AppendResponse(buf[:0], &res)
		if err := wire.DecodeResponse(buf, &got); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(buf)))
}
