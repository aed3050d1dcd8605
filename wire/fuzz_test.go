package wire_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"testing"

	"github.com/rld/rld/wire"
)

// fuzzSeeds returns valid and broken frames to start the fuzzers from.
func fuzzSeeds() [][]byte {
	req, _ := hex.DecodeString(goldenRequestHex)
	res, _ := hex.DecodeString(goldenResponseHex)
	ping := wire.AppendRequest(nil, &wire.Request{Op: wire.OpPing, ID: 1})
	pong := wire.AppendResponse(nil, &wire.Response{Op: wire.OpPing, ID: 1})
	errRes := wire.AppendResponse(nil, &wire.Response{Op: wire.OpReset, ID: 2,
		Status: wire.StatusError, Code: wire.CodeNotSupported, Message: []byte("op reserved")})
	peek := wire.AppendRequest(nil, &wire.Request{Op: wire.OpPeek, ID: 3, Descs: descs("k", "")})
	admin := wire.AppendRequest(nil, &wire.Request{Op: wire.OpAdmin, ID: 4, Body: []byte(`{"op":"config"}`)})
	adminRes := wire.AppendAdminResponse(nil, &wire.AdminResponse{ID: 4, Payload: []byte(`{"hash":"00"}`)})
	adminErr := wire.AppendAdminResponse(nil, &wire.AdminResponse{ID: 5, Code: wire.CodeForbidden,
		Payload: []byte(`{"error":{"code":"forbidden","message":"uid 1000"}}`)})
	burst := wire.AppendResponse(nil, &wire.Response{Op: wire.OpCheck, ID: 4, Status: wire.StatusAllowed,
		Limit: 50, Remaining: 49, ResetMs: 1200, WindowMs: 60000, Quota: 10, QuotaWindowMs: 60000,
		NextMs: wire.NextUnknown, Rule: []byte("burst")})

	acquire := wire.AppendRequest(nil, &wire.Request{Op: wire.OpAcquire, ID: 7, Cost: 1, Descs: descs("api_key", "k")})
	acquired := wire.AppendResponse(nil, &wire.Response{Op: wire.OpAcquire, ID: 7, Status: wire.StatusAllowed,
		Limit: 2, Remaining: 1, Rule: []byte("slots"), Token: []byte("AQEC")})
	acquireDenied := wire.AppendResponse(nil, &wire.Response{Op: wire.OpAcquire, ID: 8, Status: wire.StatusLimited,
		Limit: 2, RetryMs: 100, Rule: []byte("slots")})
	release := wire.AppendRequest(nil, &wire.Request{Op: wire.OpRelease, ID: 9, Token: []byte("AQEC")})
	settle := wire.AppendRequest(nil, &wire.Request{Op: wire.OpSettle, ID: 11, Cost: 42, Token: []byte("AQEC")})

	tooLong := bytes.Clone(req)
	binary.BigEndian.PutUint32(tooLong, wire.MaxFrame)
	badCount := bytes.Clone(req)
	badCount[16] = wire.MaxDescriptors + 1
	emptyName := bytes.Clone(req)
	emptyName[17] = 0
	badStatus := bytes.Clone(res)
	badStatus[12] = 9

	return [][]byte{
		req, res, ping, pong, errRes, peek, admin, adminRes, adminErr, burst,
		acquire, acquired, acquireDenied, release, release[:len(release)-1], settle, settle[:15],
		frame(wire.Version, wire.OpRelease, 0, 10, u16(0)), // a RELEASE of no lease
		frame(wire.Version, wire.OpAdmin, 0, 6),            // an ADMIN request without a body
		cat(req, ping),                                     // two frames: neither decoder takes it whole
		req[:len(req)-1], res[:20], ping[:4],
		tooLong, badCount, emptyName, badStatus,
		frame(wire.Version, wire.OpReset, 0, 4),
		frame(2, wire.OpPing, 0, 5),
		{}, {0, 0, 0, 0},
	}
}

// FuzzDecode checks that the decoders never panic, that every error they
// return carries a code, and that the encoding is canonical: whatever
// decodes re-encodes to the same bytes.
func FuzzDecode(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		// A request holding stale state: decoding must not keep any of it.
		req := goldenRequest()
		if err := wire.DecodeRequest(in, &req); err == nil {
			if out := wire.AppendRequest(nil, &req); !bytes.Equal(out, in) {
				t.Fatalf("request re-encodes differently:\n in %x\nout %x", in, out)
			}
			if len(in) > wire.MaxFrame || len(req.Descs) > wire.MaxDescriptors || len(req.Token) > wire.MaxTokenLen ||
				(req.Op == wire.OpRelease || req.Op == wire.OpSettle) != (len(req.Token) > 0) {
				t.Fatalf("accepted a frame beyond the limits: %d bytes, %d descriptors", len(in), len(req.Descs))
			}
			for _, d := range req.Descs {
				if limit := wire.MaxValueLen; len(d.Value) > limit && (!wire.IsAttr(d.Name) || len(d.Value) > wire.MaxAttrValueLen) {
					t.Fatalf("accepted a value of %d bytes for %q", len(d.Value), d.Name)
				}
			}
		} else if _, ok := err.(*wire.Error); !ok {
			t.Fatalf("DecodeRequest error %v is not a *wire.Error", err)
		}

		res := goldenResponse()
		if err := wire.DecodeResponse(in, &res); err == nil {
			if out := wire.AppendResponse(nil, &res); !bytes.Equal(out, in) {
				t.Fatalf("response re-encodes differently:\n in %x\nout %x", in, out)
			}
			if len(res.Token) > wire.MaxTokenLen || (res.Op != wire.OpAcquire && res.Token != nil) {
				t.Fatalf("accepted a token of %d bytes in a %#x answer", len(res.Token), res.Op)
			}
		} else if _, ok := err.(*wire.Error); !ok {
			t.Fatalf("DecodeResponse error %v is not a *wire.Error", err)
		}

		ares := wire.AdminResponse{ID: 9, Code: wire.CodeInternal, Payload: []byte("stale")}
		if err := wire.DecodeAdminResponse(in, &ares); err == nil {
			if out := wire.AppendAdminResponse(nil, &ares); !bytes.Equal(out, in) {
				t.Fatalf("admin response re-encodes differently:\n in %x\nout %x", in, out)
			}
		} else if _, ok := err.(*wire.Error); !ok {
			t.Fatalf("DecodeAdminResponse error %v is not a *wire.Error", err)
		}
	})
}

// FuzzNext checks that Next splits any byte stream into frames within the
// limits, without copying, and stops at a partial frame or lost framing.
func FuzzNext(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		for b := in; ; {
			fr, n, err := wire.Next(b)
			switch {
			case err != nil:
				if fr != nil || n != 0 {
					t.Fatalf("Next returned a frame with error %v", err)
				}
				if err != wire.ErrShortFrame && err != wire.ErrFrameTooLarge {
					t.Fatalf("Next: unexpected error %v", err)
				}
				return
			case fr == nil:
				if n != 0 {
					t.Fatalf("Next returned n=%d without a frame", n)
				}
				if len(b) >= 4 && int(binary.BigEndian.Uint32(b))+4 <= len(b) {
					t.Fatalf("Next waits for more bytes, but %x holds a whole frame", b)
				}
				return
			}
			if n != len(fr) || n < wire.HeaderSize || n > wire.MaxFrame || &fr[0] != &b[0] {
				t.Fatalf("Next returned a %d-byte frame, n=%d", len(fr), n)
			}
			if h, err := wire.ParseHeader(fr); err != nil || int(h.Length)+4 != n {
				t.Fatalf("ParseHeader on a frame from Next: %+v, %v", h, err)
			}
			b = b[n:]
		}
	})
}
