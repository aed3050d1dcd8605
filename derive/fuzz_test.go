package derive_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/rld/rld/derive"
	"github.com/rld/rld/descriptor"
	"github.com/rld/rld/internal/reqcorpus"
	"github.com/rld/rld/wire"
)

// FuzzDerive derives descriptors from arbitrary attributes under the
// corpus's configuration: it never panics, every derived value is at most
// derive.MaxValue bytes, an endpoint is a normalised path (normalising it
// again changes nothing), and the descriptors fit in a request.
func FuzzDerive(f *testing.F) {
	cases, err := reqcorpus.Load()
	if err != nil {
		f.Fatal(err)
	}
	for _, c := range cases {
		var hdr []byte
		for _, h := range c.Headers {
			hdr = append(hdr, h.Value...)
		}
		f.Add(c.Peer, c.Method, c.Host, c.Target, string(hdr))
	}
	d := corpusDeriver(f)
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	var s derive.Scratch
	f.Fuzz(func(t *testing.T, peer, method, host, target, hval string) {
		in := []descriptor.Descriptor{
			{Name: []byte(derive.AttrPeer), Value: []byte(peer)},
			{Name: []byte(derive.AttrMethod), Value: []byte(method)},
			{Name: []byte(derive.AttrHost), Value: []byte(host)},
			{Name: []byte(derive.AttrTarget), Value: []byte(target)},
		}
		for _, h := range reqcorpus.ClientHeaders {
			in = append(in, descriptor.Descriptor{Name: []byte(derive.AttrHeaderPrefix + h), Value: []byte(hval)})
		}
		in = append(in, descriptor.Descriptor{Name: []byte("tenant"), Value: []byte(hval)})
		res := d.Derive(in, now, &s)
		if len(res.Descs) > descriptor.MaxDescriptors {
			t.Fatalf("%d descriptors", len(res.Descs))
		}
		for _, ds := range res.Descs {
			if wire.IsAttr(ds.Name) {
				t.Fatalf("attribute %q among the derived descriptors", ds.Name)
			}
			if string(ds.Name) != "tenant" && len(ds.Value) > derive.MaxValue {
				t.Fatalf("%s: %d bytes", ds.Name, len(ds.Value))
			}
			if len(ds.Value) == 0 {
				t.Fatalf("%s: an empty descriptor", ds.Name)
			}
			if string(ds.Name) == derive.NameEndpoint && ds.Value[0] == '/' && !bytes.Contains(ds.Value, []byte("{")) {
				if again := derive.AppendPath(nil, ds.Value); !bytes.Equal(again, ds.Value) {
					t.Fatalf("endpoint %q normalises to %q", ds.Value, again)
				}
			}
		}
	})
}

// FuzzPath: the path rule never panics, is idempotent, yields a path that
// starts with '/' and holds only printable ASCII, and grows a target at
// most threefold.
func FuzzPath(f *testing.F) {
	for _, s := range []string{"/", "//v1//search", "/v1/x/../a/./", "/%2e%2E/%2F", "/a;b/c", "%zz%4", "http://h/p?q", "\x00\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, target string) {
		p := derive.AppendPath(nil, []byte(target))
		if len(p) == 0 || p[0] != '/' {
			t.Fatalf("%q -> %q", target, p)
		}
		for _, c := range p {
			if c <= ' ' || c >= 0x7f {
				t.Fatalf("%q -> %q: byte %#x", target, p, c)
			}
		}
		if len(p) > 3*len(target)+1 {
			t.Fatalf("%q -> %d bytes", target, len(p))
		}
		if again := derive.AppendPath(nil, p); !bytes.Equal(again, p) {
			t.Fatalf("%q -> %q -> %q", target, p, again)
		}
	})
}
