package wire_test

import (
	"bytes"
	"testing"

	"github.com/rld/rld/wire"
)

func TestAdminRoundTrip(t *testing.T) {
	body := []byte(`{"op":"explain","args":{"descriptors":[{"name":"ip","value":"192.0.2.1"}]}}`)
	f := wire.AppendRequest(nil, &wire.Request{Op: wire.OpAdmin, ID: 42, Body: body})
	want := cat(u32(uint32(8+len(body))), u8(wire.Version), u8(uint8(wire.OpAdmin)), u16(0), u32(42), body)
	if !bytes.Equal(f, want) {
		t.Fatalf("ADMIN request encodes as\n%x, want\n%x", f, want)
	}
	var r wire.Request
	if err := wire.DecodeRequest(f, &r); err != nil {
		t.Fatal(err)
	}
	if r.Op != wire.OpAdmin || r.ID != 42 || !bytes.Equal(r.Body, body) || len(r.Descs) != 0 {
		t.Fatalf("decoded %+v", r)
	}
	// A CHECK decoded into the same Request afterwards carries no body.
	if err := wire.DecodeRequest(wire.AppendRequest(nil, &wire.Request{Op: wire.OpCheck, ID: 1}), &r); err != nil || r.Body != nil {
		t.Fatalf("CHECK after ADMIN: body %q, err %v", r.Body, err)
	}

	res := wire.AdminResponse{ID: 42, Code: wire.CodeForbidden, Payload: []byte(`{"error":{"code":"forbidden"}}`)}
	rf := wire.AppendAdminResponse(nil, &res)
	wantRes := cat(u32(uint32(8+2+len(res.Payload))), u8(wire.Version), u8(uint8(wire.OpAdmin|wire.OpResponse)), u16(0), u32(42),
		u16(uint16(wire.CodeForbidden)), res.Payload)
	if !bytes.Equal(rf, wantRes) {
		t.Fatalf("ADMIN response encodes as\n%x, want\n%x", rf, wantRes)
	}
	var got wire.AdminResponse
	if err := wire.DecodeAdminResponse(rf, &got); err != nil {
		t.Fatal(err)
	}
	if got.ID != 42 || got.Code != wire.CodeForbidden || !bytes.Equal(got.Payload, res.Payload) {
		t.Fatalf("decoded %+v", got)
	}
}

func TestAdminErrors(t *testing.T) {
	big := bytes.Repeat([]byte("x"), wire.MaxAdminBody+1)
	var r wire.Request
	if err := wire.DecodeRequest(frame(wire.Version, wire.OpAdmin, 0, 3, big[:wire.MaxAdminBody]), &r); err != nil {
		t.Fatalf("a body of MaxAdminBody bytes: %v", err)
	}
	if err := wire.DecodeRequest(frame(wire.Version, wire.OpAdmin, 0, 3, big), &r); err != wire.ErrAdminTooLarge {
		t.Fatalf("a body of MaxAdminBody+1 bytes: %v", err)
	}
	var res wire.AdminResponse
	pong := wire.AppendResponse(nil, &wire.Response{Op: wire.OpPing, ID: 1})
	if err := wire.DecodeAdminResponse(pong, &res); err != wire.ErrNotAdmin {
		t.Fatalf("PING response decoded as admin: %v", err)
	}
	if err := wire.DecodeAdminResponse(frame(wire.Version, wire.OpAdmin|wire.OpResponse, 0, 1, u8(0)), &res); err != wire.ErrTruncated {
		t.Fatalf("a one-byte admin response body: %v", err)
	}
}
