package testutil

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Ints reads a comma-separated list of positive numbers (a benchmark's --nodes 1,2,4,8).
func Ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q: want positive numbers", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// JoinInts writes v as Ints reads it.
func JoinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

// WriteSection replaces, in the report at path, the section from the line begin to the line
// end with section (which carries both), or appends it: each benchmark writes its own section
// of docs/benchmarks.md.
func WriteSection(path, begin, end, section string) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	text := string(old)
	if i, j := strings.Index(text, begin), strings.Index(text, end); i >= 0 && j > i {
		text = text[:i] + strings.TrimSuffix(section, "\n") + text[j+len(end):]
	} else {
		text = strings.TrimRight(text, "\n") + "\n\n" + section
	}
	return os.WriteFile(path, []byte(text), 0o644)
}
