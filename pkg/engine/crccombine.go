package engine

import (
	"encoding/base64"
	"encoding/binary"
	"hash/crc32"

	"github.com/minio/crc64nvme"

	"github.com/prewarm/prewarm/pkg/engine/source"
)

// CRCs are linear: the CRC of A‖B follows from crc(A), crc(B) and len(B), with no access to
// the bytes (zlib's crc32_combine, for any reflected CRC whose initial value equals its final
// XOR, as CRC-32C and CRC-64/NVME have). That lets the engine checksum each part as it streams
// in, in whatever order parts arrive, and verify a file without reading it back.

type crcKind struct {
	width   uint // 32 or 64
	poly    uint64
	x2n     [64]uint64 // x^(2^k) mod p
	update  func(crc uint64, p []byte) uint64
	encoder func(crc uint64) string
}

func newCRCKind(width uint, poly uint64, update func(uint64, []byte) uint64, enc func(uint64) string) *crcKind {
	k := &crcKind{width: width, poly: poly, update: update, encoder: enc}
	k.x2n[0] = k.one() >> 1 // x^1
	for i := 1; i < 64; i++ {
		k.x2n[i] = k.mul(k.x2n[i-1], k.x2n[i-1])
	}
	return k
}

// one is x^0: the top bit, since the representation is reflected.
func (k *crcKind) one() uint64 { return 1 << (k.width - 1) }

// mul returns a·b mod p.
func (k *crcKind) mul(a, b uint64) uint64 {
	m := k.one()
	var p uint64
	for {
		if a&m != 0 {
			p ^= b
			if a&(m-1) == 0 {
				break
			}
		}
		m >>= 1
		if b&1 != 0 {
			b = (b >> 1) ^ k.poly
		} else {
			b >>= 1
		}
	}
	return p
}

// xPow8n returns x^(8n) mod p.
func (k *crcKind) xPow8n(n uint64) uint64 {
	p := k.one()
	for i := 3; n != 0; i++ {
		if n&1 != 0 {
			p = k.mul(k.x2n[i&63], p)
		}
		n >>= 1
	}
	return p
}

// combine returns the CRC of A‖B from crcA, crcB and the length of B.
func (k *crcKind) combine(crcA, crcB uint64, lenB int64) uint64 {
	return k.mul(k.xPow8n(uint64(lenB)), crcA) ^ crcB
}

var (
	crc32cTable = crc32.MakeTable(crc32.Castagnoli)

	crc64NVMEKind = newCRCKind(64, 0x9a6c9329ac4bc9b5,
		crc64nvme.Update, // carry-less multiply (PCLMULQDQ, VPCLMULQDQ) where the CPU has it
		func(c uint64) string {
			var b [8]byte
			binary.BigEndian.PutUint64(b[:], c)
			return base64.StdEncoding.EncodeToString(b[:])
		})
	crc32CKind = newCRCKind(32, uint64(crc32.Castagnoli),
		func(c uint64, p []byte) uint64 { return uint64(crc32.Update(uint32(c), crc32cTable, p)) },
		func(c uint64) string {
			var b [4]byte
			binary.BigEndian.PutUint32(b[:], uint32(c))
			return base64.StdEncoding.EncodeToString(b[:])
		})
)

// inlineKind returns the CRC a file can be verified with as its parts stream in, or nil when
// its checksum needs the whole file in order (sha256, MD5, git blob id) or it has none. It
// follows checker's order of preference.
func inlineKind(f source.Checksums) (*crcKind, string) {
	switch {
	case f.SHA256 != "":
		return nil, ""
	case f.CRC64NVME != "":
		return crc64NVMEKind, "crc64nvme"
	case f.CRC32C != "":
		return crc32CKind, "crc32c"
	}
	return nil, ""
}
