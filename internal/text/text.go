// Package text bounds the strings prewarm copies from users' objects and from the world (error
// messages, source addresses) into the fields of its own objects, whose schemas cap them.
package text

import "unicode/utf8"

// Ellipsis ends a clipped string.
const Ellipsis = "…"

// Clip returns s if it holds at most n bytes, else its longest prefix that, with Ellipsis after
// it, holds at most n bytes and ends on a whole character. A string within n bytes is within n
// characters too, so the result fits a field capped either way (the API server counts a
// schema's maxLength in characters, an event's note in bytes).
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n < len(Ellipsis) {
		return cut(s, n)
	}
	return cut(s, n-len(Ellipsis)) + Ellipsis
}

// cut is s's longest prefix of at most n bytes that ends on a whole character.
func cut(s string, n int) string {
	if n <= 0 {
		return ""
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Limits of the fields prewarm's messages go to.
const (
	// MaxMessage is the most a status entry's message holds (NodeCache and the caches' per-node
	// entries).
	MaxMessage = 1024
	// MaxReason is the most a status entry's reason holds.
	MaxReason = 64
	// MaxEventNote is the most an Event's note holds (events.k8s.io/v1, in bytes).
	MaxEventNote = 1024
	// MaxConditionMessage is the most a condition's message holds (metav1.Condition caps it at
	// 32768; prewarm keeps a margin for the sentences appended to it).
	MaxConditionMessage = 32000
)
