package text

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClip(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    string
		n    int
		want string
	}{
		{"fits", "hello", 5, "hello"},
		{"empty", "", 3, ""},
		{"clipped with an ellipsis", "hello world", 8, "hello…"},
		{"no room for the ellipsis", "hello", 2, "he"},
		{"never splits a character", "ab" + "€€€", 7, "ab…"}, // € is 3 bytes: "ab€" + … would be 8
		{"whole characters only, no room for the ellipsis", "€€", 2, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Clip(tc.s, tc.n)
			if got != tc.want {
				t.Fatalf("Clip(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
			}
			if len(got) > tc.n || !utf8.ValidString(got) {
				t.Fatalf("Clip(%q, %d) = %q: %d bytes, valid UTF-8 %v", tc.s, tc.n, got, len(got), utf8.ValidString(got))
			}
		})
	}
	long := strings.Repeat("é", 2000)
	if got := Clip(long, MaxMessage); len(got) > MaxMessage || utf8.RuneCountInString(got) > MaxMessage || !utf8.ValidString(got) {
		t.Fatalf("a long message clipped to %d bytes, %d characters", len(got), utf8.RuneCountInString(got))
	}
}
