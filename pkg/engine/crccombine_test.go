package engine

import (
	"hash/crc32"
	"hash/crc64"
	"math/rand/v2"
	"testing"
)

func TestCRCCombineEqualsWholeCRC(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	kinds := map[string]struct {
		k     *crcKind
		whole func([]byte) uint64
	}{
		"crc64nvme": {crc64NVMEKind, func(b []byte) uint64 { return crc64.Checksum(b, crc64NVME) }},
		"crc32c":    {crc32CKind, func(b []byte) uint64 { return uint64(crc32.Checksum(b, crc32cTable)) }},
	}
	for name, kd := range kinds {
		t.Run(name, func(t *testing.T) {
			for _, cuts := range [][]int{{0}, {1}, {4096}, {500_000}, {1 << 20}, {3, 70_000, 70_001, 900_000}} {
				var crc uint64
				prev := 0
				first := true
				for _, c := range append(cuts, len(data)) {
					part := kd.k.update(0, data[prev:c])
					if first {
						crc, first = part, false
					} else {
						crc = kd.k.combine(crc, part, int64(c-prev))
					}
					prev = c
				}
				if want := kd.whole(data); crc != want {
					t.Errorf("cuts %v: combined %x, whole %x", cuts, crc, want)
				}
			}
		})
	}
}
