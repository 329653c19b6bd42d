// Package docs holds the docs to the code: every reason the code gives has a row in the
// operations manual, and the flag tables list exactly the flags the binaries take.
package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prewarm/prewarm/internal/testutil"
)

var root = func() string {
	r, err := testutil.ModuleRoot()
	if err != nil {
		panic(err)
	}
	return r
}()

func operations(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// reasonConstants returns the values of the string constants named Reason… or Event… that the
// API and the shipped code declare: the reasons of conditions, of per-node states and of events.
func reasonConstants(t *testing.T) map[string]string {
	t.Helper()
	name := regexp.MustCompile(`^(Reason|Event)[A-Z]`)
	out := map[string]string{}
	for _, dir := range []string{"api", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == "testutil" {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			for _, decl := range f.Decls {
				g, ok := decl.(*ast.GenDecl)
				if !ok || g.Tok != token.CONST {
					continue
				}
				for _, spec := range g.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, id := range vs.Names {
						if !name.MatchString(id.Name) || i >= len(vs.Values) {
							continue
						}
						lit, ok := vs.Values[i].(*ast.BasicLit)
						if !ok || lit.Kind != token.STRING {
							continue
						}
						v, _ := strconv.Unquote(lit.Value)
						rel, _ := filepath.Rel(root, path)
						out[v] = rel + ": " + id.Name
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(out) < 40 {
		t.Fatalf("found %d reason constants; the walk is broken", len(out))
	}
	return out
}

// Every reason the code gives (conditions, a node's state, events) has a row in the manual's
// table of reasons, and the table names none the code does not give.
func TestEveryReasonHasATroubleshootingRow(t *testing.T) {
	doc := operations(t)
	start := strings.Index(doc, "\n### Every reason\n")
	if start < 0 {
		t.Fatal(`docs/operations.md has no "### Every reason" section`)
	}
	section := doc[start+1:]
	if end := strings.Index(section[4:], "\n## "); end >= 0 {
		section = section[:end+4]
	}
	if end := strings.Index(section[4:], "\n### "); end >= 0 {
		section = section[:end+4]
	}
	row := regexp.MustCompile("(?m)^\\| `([A-Za-z]+)` \\|")
	rows := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		rows[m[1]] = true
	}
	reasons := reasonConstants(t)
	for _, r := range slices.Sorted(func(yield func(string) bool) {
		for k := range reasons {
			if !yield(k) {
				return
			}
		}
	}) {
		if !rows[r] {
			t.Errorf("%s (%s) has no row in docs/operations.md, \"Every reason\"", r, reasons[r])
		}
	}
	for r := range rows {
		if _, ok := reasons[r]; !ok && !kubeletReasons[r] {
			t.Errorf("docs/operations.md, \"Every reason\", has a row for %s, which no constant of the code gives", r)
		}
	}
}

// kubeletReasons are reasons the manual explains that come from the kubelet, not prewarm.
var kubeletReasons = map[string]bool{"ErrImagePull": true, "ImagePullBackOff": true, "FailedMount": true}

// The manual's flag tables list exactly the flags the binaries' --help shows.
func TestFlagTablesMatchTheBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/controller", "./cmd/agent", "./cmd/kubectl-prewarm")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	doc := operations(t)
	for _, tc := range []struct {
		table string   // the line just before the table
		cmd   []string // the binary and its arguments
	}{
		{"Controller (`config/manager/controller.yaml`):", []string{"controller", "--help"}},
		{"Agent (`config/agent/daemonset.yaml`):", []string{"agent", "--help"}},
		{"Pull (`kubectl-prewarm pull --help`):", []string{"kubectl-prewarm", "pull", "--help"}},
	} {
		t.Run(tc.cmd[0], func(t *testing.T) {
			documented := tableFlags(t, doc, tc.table)
			cmd := exec.Command(filepath.Join(bin, tc.cmd[0]), tc.cmd[1:]...)
			out, _ := cmd.CombinedOutput() // flag's --help exits 2
			taken := helpFlags(string(out))
			if len(taken) < 3 {
				t.Fatalf("%v printed no flags:\n%s", tc.cmd, out)
			}
			for _, f := range taken {
				if !slices.Contains(documented, f) {
					t.Errorf("%s takes --%s; the table after %q does not list it", tc.cmd[0], f, tc.table)
				}
			}
			for _, f := range documented {
				if !slices.Contains(taken, f) {
					t.Errorf("the table after %q lists --%s; %s does not take it", tc.table, f, tc.cmd[0])
				}
			}
		})
	}
}

// tableFlags are the flags (without dashes) named in the first column of the table after the
// line marker.
func tableFlags(t *testing.T, doc, marker string) []string {
	t.Helper()
	i := strings.Index(doc, "\n"+marker+"\n")
	if i < 0 {
		t.Fatalf("docs/operations.md has no line %q", marker)
	}
	var out []string
	flag := regexp.MustCompile("`--([a-z0-9-]+)`")
	inTable := false
	for _, line := range strings.Split(doc[i+len(marker)+2:], "\n") {
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break
			}
			continue
		}
		inTable = true
		first := strings.SplitN(line, "|", 3)[1]
		for _, m := range flag.FindAllStringSubmatch(first, -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// helpFlags are the flags a --help lists, of Go's flag package ("  -name") or cobra's
// ("  -x, --name", "      --name").
func helpFlags(help string) []string {
	help, _, _ = strings.Cut(help, "Global Flags:") // kubectl's own, not prewarm's
	var out []string
	re := regexp.MustCompile(`(?m)^\s+(?:-[a-z], )?--?([a-z][a-z0-9-]*)\b`)
	for _, m := range re.FindAllStringSubmatch(help, -1) {
		if f := m[1]; f != "help" && !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}
