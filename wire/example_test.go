package wire_test

import (
	"fmt"

	"github.com/rld/rld/wire"
)

func ExampleAppendRequest() {
	req := wire.Request{Op: wire.OpCheck, ID: 7, Cost: 1, Descs: []wire.Descriptor{
		{Name: []byte("api_key"), Value: []byte("sk_123")},
		{Name: []byte("endpoint"), Value: []byte("/v1/search")},
	}}
	buf := wire.AppendRequest(nil, &req)
	fmt.Printf("%d bytes: % x\n", len(buf), buf[:wire.HeaderSize])

	// The daemon's side: cut the frame from the stream and decode it.
	f, _, err := wire.Next(buf)
	if err != nil {
		panic(err)
	}
	var got wire.Request
	if err := wire.DecodeRequest(f, &got); err != nil {
		panic(err)
	}
	for _, d := range got.Descs {
		fmt.Printf("%s=%s\n", d.Name, d.Value)
	}
	// Output:
	// 54 bytes: 00 00 00 32 01 01 00 00 00 00 00 07
	// api_key=sk_123
	// endpoint=/v1/search
}

func ExampleDecodeResponse() {
	res := wire.Response{Op: wire.OpCheck, ID: 7, Status: wire.StatusLimited,
		Limit: 30, ResetMs: 41000, RetryMs: 2000, WindowMs: 60000,
		Quota: 30, QuotaWindowMs: 60000, NextMs: 2000, Rule: []byte("search")}
	buf := wire.AppendResponse(nil, &res)

	var got wire.Response
	if err := wire.DecodeResponse(buf, &got); err != nil {
		panic(err)
	}
	fmt.Printf("id %d: %v by rule %q, %d/%d left, retry in %d ms\n",
		got.ID, got.Status, got.Rule, got.Remaining, got.Limit, got.RetryMs)
	// The IETF fields: quota q per window w seconds, and the time t in
	// seconds until quota comes back (the header package renders them all).
	fmt.Printf("RateLimit-Policy: %q;q=%d;w=%d\n", got.Rule, got.Quota, got.QuotaWindowMs/1000)
	if got.NextMs != wire.NextUnknown {
		fmt.Printf("RateLimit: %q;r=%d;t=%d\n", got.Rule, got.Remaining, (got.NextMs+999)/1000)
	}
	// Output:
	// id 7: limited by rule "search", 0/30 left, retry in 2000 ms
	// RateLimit-Policy: "search";q=30;w=60
	// RateLimit: "search";r=0;t=2
}
