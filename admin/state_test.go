package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/rld/rld/admin"
)

// stateFake is a Service that also resets and grants.
type stateFake struct {
	fake
	resets []admin.ResetArgs
	grants []admin.GrantArgs
}

func (f *stateFake) Reset(_ context.Context, a admin.ResetArgs) (admin.StateResult, error) {
	f.resets = append(f.resets, a)
	return admin.StateResult{Counters: []admin.Counter{{Rule: a.Rule, Key: a.Key.String()}}}, nil
}

func (f *stateFake) Grant(_ context.Context, a admin.GrantArgs) (admin.StateResult, error) {
	f.grants = append(f.grants, a)
	return admin.StateResult{Counters: []admin.Counter{{Rule: a.Rule, Key: a.Key.String(), Remaining: a.N}}}, nil
}

// TestStateOps: reset and grant check their target and n before the
// service sees them, are changes (logged with their caller, reported to
// Changed, refused or not), and are refused by a Service that cannot run
// them.
func TestStateOps(t *testing.T) {
	var logs bytes.Buffer
	f := &stateFake{}
	var changed []string
	s := &admin.Server{Service: f, Log: slog.New(slog.NewTextHandler(&logs, nil)),
		Changed: func(who admin.Caller, op string, _ json.RawMessage, err *admin.Error) {
			changed = append(changed, op+" "+who.String()+" "+string(func() admin.Code {
				if err != nil {
					return err.Code
				}
				return "ok"
			}()))
		}}
	who := admin.Caller{Face: "socket", UID: 7, Role: admin.RoleWrite}
	tests := []struct {
		body, code, contains string
	}{
		{`{"op":"reset","args":{"rule":"r","key":"api_key=a"}}`, "", `"key":"api_key=a"`},
		{`{"op":"reset","args":{"descriptors":[{"name":"ip","value":"1"}]}}`, "", `"counters"`},
		{`{"op":"grant","args":{"rule":"r","key":"api_key=a","n":3}}`, "", `"remaining":3`},
		{`{"op":"reset","args":{"key":"api_key=a"}}`, "bad_request", "give its rule too"},
		{`{"op":"reset","args":{"rule":"r","key":"k=v","descriptors":[{"name":"ip","value":"1"}]}}`, "bad_request", "not both"},
		{`{"op":"reset","args":{"rule":"r"}}`, "bad_request", "give descriptors"},
		{`{"op":"grant","args":{"rule":"r","key":"api_key=a"}}`, "bad_request", "n = 0"},
		{`{"op":"grant","args":{"rule":"r","key":"api_key=a","n":-1}}`, "bad_request", "n = -1"},
		{`{"op":"grant","args":{"rule":"r","key":"api_key=a","n":1,"x":1}}`, "bad_request", "unknown field"},
	}
	for _, tt := range tests {
		r := s.Serve(context.Background(), who, []byte(tt.body))
		code := ""
		if r.Err != nil {
			code = string(r.Err.Code)
		}
		if code != tt.code || !strings.Contains(string(r.Payload()), tt.contains) {
			t.Errorf("%s: code %q payload %s; want code %q containing %q", tt.body, code, r.Payload(), tt.code, tt.contains)
		}
	}
	if len(f.resets) != 2 || len(f.grants) != 1 || f.grants[0].N != 3 {
		t.Errorf("the service saw %d resets and %+v: bad requests must not reach it", len(f.resets), f.grants)
	}
	if len(changed) != len(tests) || changed[0] != "reset uid=7 ok" || changed[3] != "reset uid=7 bad_request" {
		t.Errorf("changes reported: %q", changed)
	}
	if n := strings.Count(logs.String(), `msg="admin change" who="uid=7"`); n != len(tests) {
		t.Errorf("%d changes logged with their caller, want %d:\n%s", n, len(tests), logs.String())
	}

	plain := &admin.Server{Service: &fake{}}
	r := plain.Serve(context.Background(), who, []byte(`{"op":"grant","args":{"rule":"r","key":"api_key=a","n":1}}`))
	if r.Err == nil || r.Err.Code != admin.CodeUnknownOp {
		t.Errorf("a Service without StateService: %+v", r)
	}
	for _, name := range []string{"reset", "grant"} {
		if op, ok := admin.Lookup(name); !ok || !op.Changes {
			t.Errorf("op %q: %+v, %v: want a change", name, op, ok)
		}
	}
}
