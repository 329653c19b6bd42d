package serving

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestEveryParentReconcilerRunsThroughTheRunner holds each reconciler of the package (a type with
// a Reconcile method) to reconcileParent: a parent kind brings its phase list, never a
// hand-sequenced Reconcile with its own status writes. The one status write of a parent is
// reconcileParent's; the views of the serving parents' caches (which are not parents) write their
// own.
func TestEveryParentReconcilerRunsThroughTheRunner(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var reconcilers []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			calls := calledNames(fd.Body)
			if fd.Recv != nil && fd.Name.Name == "Reconcile" {
				typ := receiverType(fd)
				reconcilers = append(reconcilers, typ)
				if !slices.Contains(calls, "reconcileParent") {
					t.Errorf("%s: %s.Reconcile does not go through reconcileParent: give the kind a parentKind with its phases", fset.Position(fd.Pos()), typ)
				}
			}
			if slices.Contains(calls, "WriteStatus") && !slices.Contains([]string{"reconcileParent", "syncWeightsView", "syncImageView"}, fd.Name.Name) {
				t.Errorf("%s: %s writes a status of its own: a parent's status is written once, by reconcileParent", fset.Position(fd.Pos()), fd.Name.Name)
			}
		}
	}
	slices.Sort(reconcilers)
	// The walk must have found the package's reconcilers, or it holds none of them.
	want := []string{"JumpStartReconciler", "ModelImageCacheReconciler", "ModelWeightsCacheConfigReconciler", "Reconciler"}
	for _, w := range want {
		if !slices.Contains(reconcilers, w) {
			t.Errorf("reconcilers found: %v; want %s among them", reconcilers, w)
		}
	}
}

// receiverType is the name of fd's receiver's type.
func receiverType(fd *ast.FuncDecl) string {
	typ := fd.Recv.List[0].Type
	if star, ok := typ.(*ast.StarExpr); ok {
		typ = star.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// calledNames are the names of the functions and methods body calls (with or without type
// arguments, through a package or a receiver).
func calledNames(body *ast.BlockStmt) []string {
	var names []string
	ast.Inspect(body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		fun := call.Fun
		switch f := fun.(type) {
		case *ast.IndexExpr:
			fun = f.X
		case *ast.IndexListExpr:
			fun = f.X
		}
		switch f := fun.(type) {
		case *ast.Ident:
			names = append(names, f.Name)
		case *ast.SelectorExpr:
			names = append(names, f.Sel.Name)
		}
		return true
	})
	return names
}
