// Package gen makes deterministic data for tests and benchmarks: pseudo-random model shards that
// do not compress and are the same on every run, and structs with every field set (Every).
package gen

import (
	"io"
	"math/rand/v2"
)

// Reader returns an endless stream of pseudo-random bytes for seed.
func Reader(seed uint64) io.Reader { return &prng{r: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))} }

// Bytes returns n pseudo-random bytes for seed.
func Bytes(seed uint64, n int) []byte {
	b := make([]byte, n)
	_, _ = io.ReadFull(Reader(seed), b) // never fails
	return b
}

type prng struct{ r *rand.Rand }

func (p *prng) Read(b []byte) (int, error) {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		v := p.r.Uint64()
		b[i], b[i+1], b[i+2], b[i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		b[i+4], b[i+5], b[i+6], b[i+7] = byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
	}
	if i < len(b) {
		v := p.r.Uint64()
		for ; i < len(b); i++ {
			b[i] = byte(v)
			v >>= 8
		}
	}
	return len(b), nil
}
