// Package docs holds the docs to the code: every reason the code gives has a row in the
// operations manual, the flag tables list exactly the flags the binaries take, and the defaults
// the manual states are the configuration's.
package docs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/prewarm/prewarm/internal/cli"
	"github.com/prewarm/prewarm/internal/config"
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

// The defaults the manual states, in the configuration's table ("Configure") and as the values
// the flags fall back to ("`agent.reserve` (`2Gi`)"), are the configuration's own: a default
// changed in internal/config and not in the manual fails here.
func TestStatedDefaultsAreTheConfiguration(t *testing.T) {
	defaults := map[string]string{}
	defaultsOf(reflect.ValueOf(config.Default()), "", defaults)
	doc := operations(t)
	checked := 0
	// The configuration's table: a row's keys, and its defaults in the same order.
	start := strings.Index(doc, "\n### Configure\n")
	if start < 0 {
		t.Fatal(`docs/operations.md has no "### Configure" section`)
	}
	key := regexp.MustCompile("`([A-Za-z][A-Za-z.\\[\\]]*)`")
	for _, row := range tableRows(doc[start:], "| key | default | meaning |") {
		var keys []string
		for _, m := range key.FindAllStringSubmatch(row[0], -1) {
			keys = append(keys, m[1])
		}
		stated := splitDefaults(row[1])
		for i, k := range keys {
			want, ok := defaults[k]
			if !ok {
				continue // no default but the zero value
			}
			if len(stated) != len(keys) {
				t.Errorf("docs/operations.md, Configure: the row of %s states %d defaults for %d keys: %q", k, len(stated), len(keys), row[1])
				break
			}
			if got := bare(stated[i]); got != want {
				t.Errorf("docs/operations.md, Configure: %s's default is %q; internal/config's is %q", k, got, want)
			}
			checked++
		}
	}
	// The flag tables: "`key` (`value`" where a flag falls back to the configuration.
	fallback := regexp.MustCompile("`([A-Za-z][A-Za-z.]*)` \\((`?)([^`;)]+)`?[;)]")
	for _, table := range []string{"Controller (`config/manager/controller.yaml`):", "Agent (`config/agent/daemonset.yaml`):"} {
		i := strings.Index(doc, "\n"+table+"\n")
		if i < 0 {
			t.Fatalf("docs/operations.md has no line %q", table)
		}
		table = strings.TrimSuffix(table, ":")
		for _, row := range tableRows(doc[i:], "| flag | default | meaning |") {
			for _, m := range fallback.FindAllStringSubmatch(row[1], -1) {
				want, ok := defaults[m[1]]
				if !ok {
					t.Errorf("docs/operations.md, %s: %s falls back to %s, which has no default in internal/config", table, row[0], m[1])
					continue
				}
				if m[3] != want {
					t.Errorf("docs/operations.md, %s: %s states %s's default as %q; internal/config's is %q", table, row[0], m[1], m[3], want)
				}
				checked++
			}
		}
	}
	t.Logf("checked %d stated defaults", checked)
	if checked < 40 {
		t.Errorf("checked %d stated defaults; the tables' parsing is broken", checked)
	}
}

// tableRows are the first two cells of the rows of the first table headed header in doc.
func tableRows(doc, header string) [][2]string {
	i := strings.Index(doc, "\n"+header+"\n")
	if i < 0 {
		return nil
	}
	var rows [][2]string
	for _, line := range strings.Split(doc[i+len(header)+2:], "\n")[1:] { // past |---|
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.SplitN(line, " | ", 3)
		if len(cells) == 3 {
			rows = append(rows, [2]string{strings.TrimPrefix(cells[0], "| "), cells[1]})
		}
	}
	return rows
}

// splitDefaults splits a default cell at its top-level commas: "`30m`, `24h`, `x` (the release's)"
// is three defaults.
func splitDefaults(cell string) []string {
	var parts []string
	depth, code, from := 0, false, 0
	for i, r := range cell {
		switch {
		case r == '`':
			code = !code
		case code:
		case r == '(' || r == '[' || r == '{':
			depth++
		case r == ')' || r == ']' || r == '}':
			depth--
		case r == ',' && depth == 0 && strings.HasPrefix(cell[i:], ", "):
			parts = append(parts, cell[from:i])
			from = i + 2
		}
	}
	return append(parts, cell[from:])
}

// bare is a stated default without its remark and quotes: "`64Gi` (at least `16Mi`)" is 64Gi.
func bare(s string) string {
	s, _, _ = strings.Cut(s, " (")
	return strings.Trim(strings.TrimSpace(s), "`")
}

// defaultsOf lists the configuration's fields that have a default other than the zero value, by
// their dotted JSON paths (a list's fields by its first entry's, as cacheRoots[].path), written as
// the manual writes them (30m, 16Mi).
func defaultsOf(v reflect.Value, at string, out map[string]string) {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return
		}
		v = v.Elem()
	}
	switch x := v.Interface().(type) {
	case metav1.Duration:
		if x.Duration != 0 {
			out[at] = cli.Duration(x.Duration)
		}
		return
	case resource.Quantity:
		if !x.IsZero() {
			out[at] = x.String()
		}
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
			if name != "" && name != "-" {
				defaultsOf(v.Field(i), strings.TrimPrefix(at+"."+name, "."), out)
			}
		}
	case reflect.Slice:
		if v.Len() > 0 && v.Type().Elem().Kind() == reflect.Struct {
			defaultsOf(v.Index(0), at+"[]", out)
		}
	case reflect.Map:
	default:
		if !v.IsZero() {
			out[at] = fmt.Sprint(v.Interface())
		}
	}
}
