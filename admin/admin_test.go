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

// fake is a Service that records what it was asked.
type fake struct{ explained []admin.ExplainArgs }

func (f *fake) Explain(_ context.Context, a admin.ExplainArgs) (admin.ExplainResult, error) {
	f.explained = append(f.explained, a)
	return admin.ExplainResult{Rules: []admin.RuleMatch{{Rule: "r"}}}, nil
}
func (f *fake) Top(_ context.Context, a admin.TopArgs) (admin.TopResult, error) {
	return admin.TopResult{Rules: []admin.RuleTop{{Rule: "n=" + strings.Repeat("x", a.N)}}, Fleet: !bool(a.Local)}, nil
}
func (f *fake) Config(context.Context) (admin.ConfigResult, error) {
	return admin.ConfigResult{Hash: "h"}, nil
}

func TestServe(t *testing.T) {
	var logs bytes.Buffer
	f := &fake{}
	s := &admin.Server{Service: f, Log: slog.New(slog.NewTextHandler(&logs, nil))}
	who := admin.Caller{Face: "socket", UID: 1000, Role: admin.RoleWrite}
	tests := []struct {
		body, code, contains string
	}{
		{`{"op":"explain","args":{"descriptors":[{"name":"ip","value":"1"}],"cost":2}}`, "", `"rule":"r"`},
		{`{"op":"top"}`, "", `"n=xxxxxxxxxx"`}, // n defaults to 10
		{`{"op":"top","args":{"n":2}}`, "", `"n=xx"`},
		{`{"op":"config","args":{}}`, "", `"hash":"h"`},
		{`not json`, "bad_request", "request is not"},
		{`{"op":"explain"} trailing`, "bad_request", "trailing"},
		{`{"op":"explain","argz":{}}`, "bad_request", "unknown field"},
		{`{"op":"frobnicate"}`, "unknown_op", `no admin op \"frobnicate\"`},
		{`{"op":"explain","args":{"descriptors":[]}}`, "bad_request", "at least one"},
		{`{"op":"explain","args":{"descriptors":[{"name":"ip","value":"1"}],"cost":-1}}`, "bad_request", "cost = -1"},
		{`{"op":"explain","args":{"descriptors":[{"name":"","value":"1"}]}}`, "bad_request", "empty"},
		{`{"op":"top","args":{"n":-1}}`, "bad_request", "n = -1"},
		{`{"op":"top","args":{"local":true}}`, "", `"fleet":false`},
		{`{"op":"top","args":{"local":"true"}}`, "", `"fleet":false`}, // a GET's ?local=true
		{`{"op":"top","args":{"local":1}}`, "", `"fleet":false`},
		{`{"op":"top","args":{"local":"0"}}`, "", `"fleet":true`},
		{`{"op":"top","args":{"local":"maybe"}}`, "bad_request", "not a boolean"},
		{`{"op":"config","args":{"x":1}}`, "bad_request", "unknown field"},
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
		if r.Err != nil {
			back := admin.ParsePayload(r.Payload(), false)
			if back.Err == nil || *back.Err != *r.Err {
				t.Errorf("%s: payload does not parse back: %+v", tt.body, back)
			}
		}
	}
	if len(f.explained) != 1 || f.explained[0].Cost != 2 {
		t.Errorf("explain ran %d times (%+v): bad requests must not reach the service", len(f.explained), f.explained)
	}
	if n := strings.Count(logs.String(), "admin request refused"); n != 10 {
		t.Errorf("%d refusals logged, want 10:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), `who="uid=1000"`) {
		t.Errorf("refusals do not name the caller:\n%s", logs.String())
	}
	var res admin.ExplainResult
	if err := json.Unmarshal(s.Serve(context.Background(), who, []byte(`{"op":"explain","args":{"descriptors":[{"name":"a","value":""}]}}`)).Result, &res); err != nil {
		t.Fatal(err)
	}
}

func TestOpsTable(t *testing.T) {
	for _, name := range []string{"explain", "top", "config"} {
		op, ok := admin.Lookup(name)
		if !ok || op.Changes || op.Help == "" {
			t.Errorf("op %q: %+v, %v", name, op, ok)
		}
	}
}

// TestAdminRoles: the read role may run exactly the ops that change
// nothing (explain, top, list, config), the write role every op, and no
// role none; a read caller's change is refused forbidden and never
// reaches the service.
func TestAdminRoles(t *testing.T) {
	reads := map[string]bool{"explain": true, "top": true, "list": true, "config": true}
	for _, op := range admin.Ops() {
		if got := admin.RoleRead.Allows(op); got != reads[op.Name] {
			t.Errorf("read role allows %s: %v, want %v", op.Name, got, reads[op.Name])
		}
		if !admin.RoleWrite.Allows(op) || admin.RoleNone.Allows(op) {
			t.Errorf("%s: write must run it, no role must not", op.Name)
		}
	}
	f := &fake{}
	s := &admin.Server{Service: f}
	r := s.Serve(context.Background(), admin.Caller{Face: "socket", UID: 5}, []byte(`{"op":"explain","args":{"descriptors":[{"name":"a","value":"1"}]}}`))
	if r.Err == nil || r.Err.Code != admin.CodeForbidden || len(f.explained) != 0 {
		t.Errorf("no role: %+v, explained %d", r.Err, len(f.explained))
	}
	before := admin.Refused(admin.ReasonRole)
	r = s.Serve(context.Background(), admin.Caller{Face: "socket", UID: 5, Role: admin.RoleRead}, []byte(`{"op":"config"}`))
	if r.Err != nil {
		t.Errorf("read role, config: %+v", r.Err)
	}
	if got := admin.Refused(admin.ReasonRole) - before; got != 0 {
		t.Errorf("a read counted as refused %d times", got)
	}
}
