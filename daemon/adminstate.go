package daemon

import (
	"context"
	"errors"
	"time"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/algo"
	"github.com/rld/rld/descriptor"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/redisx"
)

// Reset implements admin.StateService.
func (s adminService) Reset(ctx context.Context, a admin.ResetArgs) (admin.StateResult, error) {
	return s.operate(ctx, algo.OpReset, 0, a.Target)
}

// Grant implements admin.StateService.
func (s adminService) Grant(ctx context.Context, a admin.GrantArgs) (admin.StateResult, error) {
	return s.operate(ctx, algo.OpGrant, a.N, a.Target)
}

// operate runs kind (n units of a grant) on the counters t names.
func (s adminService) operate(ctx context.Context, kind algo.OpKind, n int64, t admin.Target) (admin.StateResult, error) {
	pt := policy.Target{Rule: t.Rule, Key: t.Key}
	for _, d := range t.Descriptors {
		pt.Descriptors = append(pt.Descriptors, descriptor.Descriptor{Name: []byte(d.Name), Value: []byte(d.Value)})
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	applied, err := s.d.pol().Operate(ctx, time.Now(), kind, n, pt)
	if errors.Is(err, policy.ErrNoMatch) {
		return admin.StateResult{}, admin.Errorf(admin.CodeNotFound, "%v", err)
	}
	if err != nil {
		return admin.StateResult{}, err
	}
	failed := 0
	res := admin.StateResult{Counters: make([]admin.Counter, 0, len(applied))}
	for _, a := range applied {
		if a.Err != nil {
			failed++
		}
		c := admin.Counter{Rule: a.Rule, Key: a.Key, Tier: a.Tier, Algorithm: a.Params.Kind.String(), Mode: string(a.Mode)}
		if a.Err != nil {
			c.Error = a.Err.Error()
		} else {
			c.Remaining, c.ResetMs = a.Result.Remaining, a.Result.Reset.Milliseconds()
		}
		res.Counters = append(res.Counters, c)
	}
	if failed == len(applied) {
		// The op failed on every counter; one that timed out may still
		// have reached the store, which the answer then says.
		a := applied[0]
		maybe := ""
		if redisx.IsTimeout(a.Err) {
			maybe = " (the call timed out: it may still have reached the store)"
		}
		return admin.StateResult{}, admin.Errorf(admin.CodeInternal, "%s of rule %q key %s failed%s: %v", kind, a.Rule, a.Key, maybe, a.Err)
	}
	return res, nil
}
