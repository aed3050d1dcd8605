package algo

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The stores that consult the op table and the algorithm table instead of
// switching on kinds: a new OpKind or Kind must need nothing in them.
var tableUsers = []string{"memstore", "shardcache", "redisx"}

// kindSwitchAllowed lists the functions of tableUsers (package.function)
// that may compare an op's kind with an algo.Op* constant, and why the
// table cannot say it for them. Each is the hot-key cache's own
// protocol: it matches the outcome of an op to the op it built itself (a
// lease's return, a renewal, a view), and no new kind of op reaches it
// unless the cache is taught to send it. Nothing may name an algorithm
// (algo.TokenBucket …): what a store needs of an algorithm is in
// KindInfo.
var kindSwitchAllowed = map[string]string{
	"shardcache.apply":    "counts the sync's own returns (refund) and renewals (lease)",
	"shardcache.keep":     "keeps the units of the sync's own return (refund) that was not sent",
	"shardcache.refunded": "announces the settle's refunds (a release's Result is not a refund's)",
	"shardcache.Recalled": "queues or counts its own return (refund) of a recalled lease",
	"shardcache.giveBack": "requeues or counts its own return (refund) of a grant that came after a recall",
}

// kindConsts returns the names of algo's constants of type OpKind and of
// type Kind, less the counts (NumOpKinds, NumKinds): read from the
// package's source, so that a new kind is checked with no change here.
func kindConsts(t *testing.T) (ops, kinds map[string]bool) {
	ops, kinds = map[string]bool{}, map[string]bool{}
	fset := token.NewFileSet()
	for _, name := range []string{"op.go", "algo.go"} {
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			var typ string
			for _, s := range gd.Specs {
				vs := s.(*ast.ValueSpec)
				if id, ok := vs.Type.(*ast.Ident); ok {
					typ = id.Name
				} else if vs.Type != nil || len(vs.Values) > 0 {
					typ = ""
				}
				for _, n := range vs.Names {
					switch {
					case strings.HasPrefix(n.Name, "Num"):
					case typ == "OpKind":
						ops[n.Name] = true
					case typ == "Kind":
						kinds[n.Name] = true
					}
				}
			}
		}
	}
	require.Contains(t, ops, "OpTake")
	require.Contains(t, kinds, "Concurrency")
	return ops, kinds
}

// kindUses returns the places in f (of package pkg) that switch on a
// kind: a comparison with, or a case of, an algo.Op* constant outside the
// functions allowed, and any use of an algorithm's constant.
func kindUses(fset *token.FileSet, pkg string, f *ast.File, ops, kinds map[string]bool) []string {
	var found []string
	isConst := func(e ast.Expr, set map[string]bool) bool {
		se, ok := ast.Unparen(e).(*ast.SelectorExpr)
		if !ok {
			return false
		}
		x, ok := se.X.(*ast.Ident)
		return ok && x.Name == "algo" && set[se.Sel.Name]
	}
	report := func(n ast.Node, fn, what string) {
		found = append(found, fset.Position(n.Pos()).String()+": "+pkg+"."+fn+": "+what)
	}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		fn := "(top level)"
		if ok {
			fn = fd.Name.Name
		}
		_, allowed := kindSwitchAllowed[pkg+"."+fn]
		ast.Inspect(d, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if isConst(n, kinds) {
					report(n, fn, "names an algorithm ("+n.Sel.Name+"): use algo.KindInfo")
				}
			case *ast.BinaryExpr:
				if !allowed && (isConst(n.X, ops) || isConst(n.Y, ops)) {
					report(n, fn, "compares an op kind with a constant: use algo.OpInfo")
				}
			case *ast.CaseClause:
				for _, e := range n.List {
					if !allowed && isConst(e, ops) {
						report(e, fn, "switches on an op kind: use algo.OpInfo")
					}
				}
			}
			return true
		})
	}
	return found
}

// TestStoresUseTheTables: memstore, shardcache and redisx switch on no op
// kind (outside kindSwitchAllowed) and name no algorithm, so that adding
// an op or an algorithm is algo, lua and docs only.
func TestStoresUseTheTables(t *testing.T) {
	ops, kinds := kindConsts(t)
	var found []string
	fset := token.NewFileSet()
	seen := map[string]bool{}
	for _, pkg := range tableUsers {
		files, err := filepath.Glob(filepath.Join("..", pkg, "*.go"))
		require.NoError(t, err)
		require.NotEmpty(t, files, pkg)
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, 0)
			require.NoError(t, err)
			found = append(found, kindUses(fset, pkg, f, ops, kinds)...)
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok {
					seen[pkg+"."+fd.Name.Name] = true
				}
			}
		}
	}
	sort.Strings(found)
	assert.Empty(t, found, "switches on kinds the tables describe:\n%s", strings.Join(found, "\n"))
	for fn := range kindSwitchAllowed {
		assert.True(t, seen[fn], "kindSwitchAllowed names %s, which is gone: drop it", fn)
	}
}

// TestKindUsesFindsSwitches: the check of TestStoresUseTheTables finds a
// switch on an op kind, a comparison with one, and an algorithm named,
// and lets a constructed op and a bounds check pass.
func TestKindUsesFindsSwitches(t *testing.T) {
	ops, kinds := kindConsts(t)
	const src = `package memstore
func bad(op *algo.Op) bool {
	switch op.Kind {
	case algo.OpTake:
	}
	if op.Params.Kind == algo.SlidingLog {
		return true
	}
	return op.Kind != algo.OpRefund
}
func good(op *algo.Op) bool {
	o := algo.Op{Kind: algo.OpRefund}
	return o.Kind < algo.NumOpKinds && op.Kind.Info().Take
}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "bad.go", src, 0)
	require.NoError(t, err)
	found := kindUses(fset, "memstore", f, ops, kinds)
	require.Len(t, found, 3, strings.Join(found, "\n"))
	for _, s := range found {
		assert.Contains(t, s, "memstore.bad")
	}
}
