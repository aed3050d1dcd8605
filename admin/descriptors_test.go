package admin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/change"
)

// formsFake records the arguments of every op that names descriptors.
type formsFake struct {
	stateFake
	overrides []admin.OverrideArgs
	blocks    []admin.BlockArgs
}

func (f *formsFake) SetOverride(_ context.Context, a admin.OverrideArgs) (admin.OverrideEntry, error) {
	f.overrides = append(f.overrides, a)
	return admin.OverrideEntry{Override: change.Override{ID: "o-1", Rule: a.Rule, Key: a.Key, Match: a.Match}}, nil
}
func (f *formsFake) DeleteOverride(context.Context, admin.IDArgs) (admin.Deleted, error) {
	return admin.Deleted{}, nil
}
func (f *formsFake) Block(_ context.Context, a admin.BlockArgs) (admin.BlockEntry, error) {
	f.blocks = append(f.blocks, a)
	return admin.BlockEntry{Block: change.Block{ID: "b-1", Rule: a.Rule, Key: a.Key, Match: a.Match}}, nil
}
func (f *formsFake) Unblock(context.Context, admin.IDArgs) (admin.Deleted, error) {
	return admin.Deleted{}, nil
}
func (f *formsFake) List(context.Context) (admin.ListResult, error) {
	return admin.ListResult{}, nil
}

// TestOneDescriptorForm: every op that names descriptors takes them as a
// JSON object of name → value; a key also as the text explain prints
// ("api_key=k,tenant=t"), descriptors also as a list of {name,value}.
// Each form reaches the service as the same value; answers write the
// object form; malformed forms are refused before the service.
func TestOneDescriptorForm(t *testing.T) {
	f := &formsFake{}
	s := &admin.Server{Service: f}
	who := admin.Caller{Face: "http", UID: -1, Role: admin.RoleWrite}
	serve := func(op, args string) *admin.Error {
		t.Helper()
		return s.Run(context.Background(), who, admin.Request{Op: op, Args: json.RawMessage(args)}).Err
	}
	want := admin.Pairs{"api_key": "k", "tenant": "t"}
	for _, key := range []string{`{"api_key":"k","tenant":"t"}`, `"api_key=k,tenant=t"`, `"tenant=t,api_key=k"`} {
		for _, op := range []string{"reset", "grant", "override-set", "block"} {
			args := `{"rule":"r","key":` + key + `,"n":1,"limit":5,"ttl":"1h"}`
			switch op {
			case "reset":
				args = `{"rule":"r","key":` + key + `}`
			case "block":
				args = `{"rule":"r","key":` + key + `,"ttl":"1h"}`
			case "override-set":
				args = `{"rule":"r","key":` + key + `,"limit":5,"ttl":"1h"}`
			case "grant":
				args = `{"rule":"r","key":` + key + `,"n":1}`
			}
			if err := serve(op, args); err != nil {
				t.Fatalf("%s %s: %v", op, args, err)
			}
		}
	}
	for i := range 3 {
		for name, got := range map[string]admin.Pairs{
			"reset": f.resets[i].Key, "grant": f.grants[i].Key,
			"override-set": f.overrides[i].Key, "block": f.blocks[i].Key,
		} {
			if !reflect.DeepEqual(got, want) {
				t.Errorf("form %d, %s: key %v, want %v", i, name, got, want)
			}
		}
	}

	// Match globs: object or text, the same.
	for _, m := range []string{`{"ip":"203.0.113.*"}`, `"ip=203.0.113.*"`} {
		if err := serve("block", `{"match":`+m+`,"ttl":"1h"}`); err != nil {
			t.Fatal(err)
		}
	}
	if !reflect.DeepEqual(f.blocks[3].Match, f.blocks[4].Match) || f.blocks[4].Match["ip"] != "203.0.113.*" {
		t.Errorf("match forms differ: %v, %v", f.blocks[3].Match, f.blocks[4].Match)
	}

	// Descriptors: object (in its order) or list, the same.
	for _, d := range []string{`{"ip":"1","endpoint":"/a,b"}`, `[{"name":"ip","value":"1"},{"name":"endpoint","value":"/a,b"}]`} {
		if err := serve("reset", `{"descriptors":`+d+`}`); err != nil {
			t.Fatal(err)
		}
	}
	wantD := admin.Descriptors{{Name: "ip", Value: "1"}, {Name: "endpoint", Value: "/a,b"}}
	for _, r := range f.resets[3:5] {
		if !reflect.DeepEqual(r.Descriptors, wantD) {
			t.Errorf("descriptors %v, want %v", r.Descriptors, wantD)
		}
	}
	b, _ := json.Marshal(admin.ExplainArgs{Descriptors: wantD})
	if string(b) != `{"descriptors":{"ip":"1","endpoint":"/a,b"}}` {
		t.Errorf("descriptors encode as %s, want the object form in order", b)
	}
	res := s.Run(context.Background(), who, admin.Request{Op: "block", Args: json.RawMessage(`{"rule":"r","key":"api_key=k","ttl":"1h"}`)})
	if !strings.Contains(string(res.Result), `"key":{"api_key":"k"}`) {
		t.Errorf("an answer writes a key as an object: %s", res.Result)
	}

	// Bad forms: refused, nothing reaches the service.
	n := len(f.resets) + len(f.grants) + len(f.overrides) + len(f.blocks)
	for _, tt := range []struct{ op, args, contains string }{
		{"reset", `{"rule":"r","key":"api_key"}`, "not name=value"},
		{"reset", `{"rule":"r","key":"=k"}`, "empty name"},
		{"reset", `{"rule":"r","key":"a=1,a=2"}`, "given twice"},
		{"reset", `{"rule":"r","key":""}`, "empty"},
		{"reset", `{"rule":"r","key":{"api_key":1}}`, "JSON object"},
		{"reset", `{"rule":"r","key":["api_key=k"]}`, "JSON object"},
		{"reset", `{"descriptors":{"ip":"1","ip":"2"}}`, "given twice"},
		{"reset", `{"descriptors":{"ip":1}}`, "must be a string"},
		{"reset", `{"descriptors":"ip=1"}`, "JSON object"},
		{"reset", `{"descriptors":[{"name":"ip","valu":"1"}]}`, "unknown field"},
		{"block", `{"match":{"ip":""},"ttl":"1h","reason":"` + strings.Repeat("x", 600) + `"}`, "reason: 600 bytes"},
		{"override-set", `{"rule":"r","key":{"api_key":"` + strings.Repeat("x", 1100) + `"},"limit":1,"ttl":"1h"}`, "longer than 1024"},
		{"block", `{"rule":"r","key":"k=v","ttl":"1h","author":"` + strings.Repeat("x", 200) + `"}`, "author: 200 bytes"},
	} {
		err := serve(tt.op, tt.args)
		if err == nil || err.Code != admin.CodeBadRequest || !strings.Contains(err.Message, tt.contains) {
			t.Errorf("%s %s: %v, want bad_request containing %q", tt.op, tt.args, err, tt.contains)
		}
	}
	if m := len(f.resets) + len(f.grants) + len(f.overrides) + len(f.blocks); m != n {
		t.Errorf("%d bad requests reached the service", m-n)
	}
}

func TestParsePairs(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want admin.Pairs
		err  string
	}{
		{"api_key=k", admin.Pairs{"api_key": "k"}, ""},
		{"api_key=k,tenant=t", admin.Pairs{"api_key": "k", "tenant": "t"}, ""},
		{"ip=a,b", admin.Pairs{"ip": "a,b"}, ""}, // a part without = continues the value
		{"ip=a,b,tenant=t=u", admin.Pairs{"ip": "a,b", "tenant": "t=u"}, ""},
		{"ip=", admin.Pairs{"ip": ""}, ""},
		{"", nil, "empty"},
		{"ip", nil, "not name=value"},
		{"=v", nil, "empty name"},
		{"a=1,a=2", nil, "given twice"},
	} {
		got, err := admin.ParsePairs(tt.in)
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("ParsePairs(%q) = %v, %v; want error %q", tt.in, got, err, tt.err)
		case tt.err == "" && (err != nil || !reflect.DeepEqual(got, tt.want)):
			t.Errorf("ParsePairs(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
		if tt.err == "" {
			if back, err := admin.ParsePairs(got.String()); err != nil || !reflect.DeepEqual(back, got) {
				t.Errorf("%v.String() = %q reads back as %v, %v", got, got.String(), back, err)
			}
		}
	}
}

// TestPage: list's pages of thousands of entries, followed by their
// cursors, hold each entry once, in order of id, each page within its
// limit and MaxPageBytes; paging goes on when the entry a cursor names
// is deleted between pages; a bad cursor or limit is refused.
func TestPage(t *testing.T) {
	var all admin.ListResult
	const n = 5000
	for i := range n {
		id := fmt.Sprintf("%x", 0x100000+i*7919%n)
		if i%3 == 0 {
			all.Blocks = append(all.Blocks, admin.BlockEntry{Block: change.Block{ID: "b-" + id, Match: admin.Pairs{"ip": "203.0.113.*"},
				Reason: strings.Repeat("r", i%300), Expires: time.Now().Add(time.Hour)}})
		} else {
			all.Overrides = append(all.Overrides, admin.OverrideEntry{Override: change.Override{ID: "o-" + id, Rule: "search",
				Key: admin.Pairs{"api_key": "k" + id}, Limit: 10, Expires: time.Now().Add(time.Hour)}})
		}
	}
	for _, limit := range []int{0, 3, 37, admin.MaxListLimit} {
		seen := map[string]bool{}
		var ids []string
		a := admin.ListArgs{Limit: limit}
		pages, deleted := 0, 0
		for {
			p, err := admin.Page(all, a)
			if err != nil {
				t.Fatal(err)
			}
			pages++
			b, _ := json.Marshal(p)
			if len(b) > admin.MaxPageBytes+200 {
				t.Fatalf("limit %d: a page of %d bytes", limit, len(b))
			}
			got := len(p.Overrides) + len(p.Blocks)
			if max(limit, 0) > 0 && got > limit || limit == 0 && got > admin.DefaultListLimit || got == 0 && p.Next != "" {
				t.Fatalf("limit %d: a page of %d entries, next %q", limit, got, p.Next)
			}
			for _, b := range p.Blocks {
				ids = append(ids, b.ID)
			}
			for _, o := range p.Overrides {
				ids = append(ids, o.ID)
			}
			if p.Next == "" {
				break
			}
			if pages == 2 {
				// The entry the cursor names goes away: paging goes on.
				all.Blocks = slices.DeleteFunc(all.Blocks, func(b admin.BlockEntry) bool { return b.ID == p.Next })
				all.Overrides = slices.DeleteFunc(all.Overrides, func(o admin.OverrideEntry) bool { return o.ID == p.Next })
				deleted++
			}
			a.Cursor = p.Next
		}
		for _, id := range ids {
			if seen[id] {
				t.Fatalf("limit %d: %s listed twice", limit, id)
			}
			seen[id] = true
		}
		if len(ids) != len(all.Blocks)+len(all.Overrides)+deleted {
			t.Errorf("limit %d: %d entries listed, %d stored, %d deleted after it was listed", limit, len(ids), len(all.Blocks)+len(all.Overrides), deleted)
		}
		if !slices.IsSorted(ids) {
			t.Errorf("limit %d: not in order of id", limit)
		}
		t.Logf("limit %d: %d pages", limit, pages)
	}

	f := &formsFake{}
	s := &admin.Server{Service: f}
	for _, args := range []string{`{"cursor":"x"}`, `{"cursor":"o-"}`, `{"cursor":"o-12G"}`, `{"cursor":"q-12"}`,
		`{"limit":-1}`, `{"limit":1001}`, `{"cursr":"o-1"}`} {
		r := s.Run(context.Background(), admin.Caller{Role: admin.RoleRead}, admin.Request{Op: "list", Args: json.RawMessage(args)})
		if r.Err == nil || r.Err.Code != admin.CodeBadRequest {
			t.Errorf("list %s: %+v, want bad_request", args, r)
		}
	}
}
