package daemon

import (
	"testing"
	"time"

	"github.com/rld/rld/descriptor"
	"github.com/rld/rld/wire"
)

// frameOfDescriptors returns a CHECK frame of n descriptors k<i>=v<i>.
func frameOfDescriptors(n int) []byte {
	req := wire.Request{Op: wire.OpCheck, ID: 1, Cost: 1}
	for i := range n {
		req.Descs = append(req.Descs, wire.Descriptor{Name: []byte{'k', byte('a' + i)}, Value: []byte{'v', byte('a' + i)}})
	}
	return wire.AppendRequest(nil, &req)
}

// TestFrameDescriptorsReachPolicyWithoutAllocating: the descriptors a
// frame decodes to are handed to policy as package descriptor's type,
// aliasing the frame (no bytes copied), in the per-connection scratch
// slice, with no allocation from frame to frame.
func TestFrameDescriptorsReachPolicyWithoutAllocating(t *testing.T) {
	fs := newFrameState(nil)
	frame := frameOfDescriptors(wire.MaxDescriptors)
	now := time.Now()
	decode := func() {
		if err := wire.DecodeRequest(frame, &fs.req); err != nil {
			t.Fatal(err)
		}
		fs.deriveDescs(now)
	}
	decode()
	if len(fs.descs) != wire.MaxDescriptors {
		t.Fatalf("%d descriptors reach policy, want %d", len(fs.descs), wire.MaxDescriptors)
	}
	for i := range fs.descs {
		d, w := fs.descs[i], fs.req.Descs[i]
		if &d.Name[0] != &w.Name[0] || &d.Value[0] != &w.Value[0] {
			t.Fatalf("descriptor %d (%s=%s) does not alias the frame", i, d.Name, d.Value)
		}
	}
	if n := testing.AllocsPerRun(100, decode); n != 0 {
		t.Errorf("decoding and converting a frame of %d descriptors allocates %v times, want 0", wire.MaxDescriptors, n)
	}
}

// BenchmarkAppendDescriptors measures the conversion of a typical
// request's decoded descriptors (4) into package descriptor's type.
func BenchmarkAppendDescriptors(b *testing.B) {
	var req wire.Request
	if err := wire.DecodeRequest(frameOfDescriptors(4), &req); err != nil {
		b.Fatal(err)
	}
	dst := make([]descriptor.Descriptor, 0, descriptor.MaxDescriptors)
	b.ReportAllocs()
	for b.Loop() {
		dst = appendDescriptors(dst[:0], req.Descs)
	}
	if len(dst) != 4 {
		b.Fatal(len(dst))
	}
}
