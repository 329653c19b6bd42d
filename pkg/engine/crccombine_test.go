package engine

import (
	"hash/crc32"
	"hash/crc64"
	"math/rand/v2"
	"testing"
)

// nvmeTable is the standard library's table-driven CRC-64/NVME, the one the AWS SDK computes
// S3's CRC64NVME with: the reference the accelerated code must agree with.
var nvmeTable = crc64.MakeTable(0x9a6c9329ac4bc9b5)

// The accelerated CRC-64/NVME (carry-less multiply, 128-byte and 1 KiB blocks, a 16-byte
// alignment prologue) gives the table's value for every length and alignment, whole or
// updated in pieces.
func TestCRC64NVMEMatchesTheTable(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	data := make([]byte, 3<<20+123)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	check := func(b []byte) {
		t.Helper()
		if got, want := crc64NVMEKind.update(0, b), crc64.Checksum(b, nvmeTable); got != want {
			t.Fatalf("%d bytes at %p: %x, table %x", len(b), b, got, want)
		}
	}
	for align := range 17 {
		for n := 0; n <= 2200; n++ {
			check(data[align : align+n])
		}
	}
	check(data)
	// Updated in uneven pieces, as a part arrives from a socket.
	var crc uint64
	for off := 0; off < len(data); {
		n := min(len(data)-off, 1+int(r.Uint32N(300_000)))
		crc = crc64NVMEKind.update(crc, data[off:off+n])
		off += n
	}
	if want := crc64.Checksum(data, nvmeTable); crc != want {
		t.Fatalf("piecewise %x, table %x", crc, want)
	}
}

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
		"crc64nvme": {crc64NVMEKind, func(b []byte) uint64 { return crc64.Checksum(b, nvmeTable) }},
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

// BenchmarkChecksums compares, per 1 MiB chunk (the engine's read size), the CRCs a part goes
// through: CRC-64/NVME accelerated and table-driven, CRC-32C (hardware in hash/crc32).
func BenchmarkChecksums(b *testing.B) {
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for name, f := range map[string]func([]byte) uint64{
		"crc64nvme-accelerated": func(p []byte) uint64 { return crc64NVMEKind.update(0, p) },
		"crc64nvme-table":       func(p []byte) uint64 { return crc64.Update(0, nvmeTable, p) },
		"crc32c":                func(p []byte) uint64 { return uint64(crc32.Update(0, crc32cTable, p)) },
	} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				f(data)
			}
		})
	}
}
