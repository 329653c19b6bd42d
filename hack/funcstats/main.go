// Command funcstats lists the functions of a Go tree that are long or take
// many parameters, with totals, so that two versions of the code can be
// compared: go run ./hack/funcstats [-lines N] [-params N] [dir...]
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

type fn struct {
	pos    string
	name   string
	lines  int
	params int
}

func main() {
	maxLines := flag.Int("lines", 60, "list functions longer than this many lines")
	maxParams := flag.Int("params", 5, "list functions with more parameters than this")
	flag.Parse()
	dirs := flag.Args()
	if len(dirs) == 0 {
		dirs = []string{"."}
	}
	var all []fn
	fset := token.NewFileSet()
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "vendor" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != dir {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasPrefix(d.Name(), "zz_generated") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			all = append(all, funcs(fset, f)...)
			return nil
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	report(all, *maxLines, *maxParams)
}

func funcs(fset *token.FileSet, f *ast.File) []fn {
	var out []fn
	for _, decl := range f.Decls {
		d, ok := decl.(*ast.FuncDecl)
		if !ok || d.Body == nil {
			continue
		}
		name := d.Name.Name
		if d.Recv != nil && len(d.Recv.List) > 0 {
			name = recvName(d.Recv.List[0].Type) + "." + name
		}
		params := 0
		for _, p := range d.Type.Params.List {
			params += max(1, len(p.Names))
		}
		start := fset.Position(d.Pos())
		out = append(out, fn{
			pos:    fmt.Sprintf("%s:%d", start.Filename, start.Line),
			name:   name,
			lines:  fset.Position(d.End()).Line - start.Line + 1,
			params: params,
		})
	}
	return out
}

func recvName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.IndexExpr:
		return recvName(t.X)
	case *ast.IndexListExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	}
	return "?"
}

func report(all []fn, maxLines, maxParams int) {
	sort.Slice(all, func(i, j int) bool { return all[i].lines > all[j].lines })
	total, long, wide := 0, 0, 0
	for _, f := range all {
		total += f.lines
		if f.lines > maxLines {
			long++
			fmt.Printf("lines %4d  params %2d  %s  %s\n", f.lines, f.params, f.name, f.pos)
		}
	}
	for _, f := range all {
		if f.params > maxParams {
			wide++
			if f.lines <= maxLines {
				fmt.Printf("lines %4d  params %2d  %s  %s\n", f.lines, f.params, f.name, f.pos)
			}
		}
	}
	mean := 0.0
	if len(all) > 0 {
		mean = float64(total) / float64(len(all))
	}
	fmt.Printf("functions %d, mean %.1f lines, %d over %d lines, %d over %d parameters\n",
		len(all), mean, long, maxLines, wide, maxParams)
}
