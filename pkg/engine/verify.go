package engine

import (
	"context"
	"crypto/md5"  //nolint:gosec // S3 ETags are MD5: this checks integrity, not authenticity
	"crypto/sha1" //nolint:gosec // git blob ids
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"hash/crc32"
	"hash/crc64"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/prewarm/prewarm/pkg/engine/source"
)

var crc64NVME = crc64.MakeTable(0x9a6c9329ac4bc9b5) // CRC-64/NVME, reflected

// checker picks the checksum to verify a file with: sha256, then the S3 full-object CRCs
// (fast to compute, and as good as MD5 at catching damage), then MD5, then the git blob id. It
// returns nil when the source gave none (size is then the only check). size is the file's.
func checker(c source.Checksums, size int64) (kind, want string, h hash.Hash, encode func([]byte) string) {
	hexEnc := hex.EncodeToString
	switch {
	case c.SHA256 != "":
		return "sha256", strings.ToLower(c.SHA256), sha256.New(), hexEnc
	case c.CRC64NVME != "":
		return "crc64nvme", c.CRC64NVME, crc64.New(crc64NVME), base64.StdEncoding.EncodeToString
	case c.CRC32C != "":
		return "crc32c", c.CRC32C, crc32.New(crc32.MakeTable(crc32.Castagnoli)), base64.StdEncoding.EncodeToString
	case c.MD5 != "":
		return "md5", strings.ToLower(c.MD5), md5.New(), hexEnc //nolint:gosec // see import
	case c.GitBlobSHA1 != "":
		h := sha1.New() //nolint:gosec // git blob ids are SHA-1; integrity, not authenticity
		fmt.Fprintf(h, "blob %d\x00", size)
		return "git-sha1", strings.ToLower(c.GitBlobSHA1), h, hexEnc
	}
	return "", "", nil, nil
}

// verifyFile checks a written file's size and, when the source vouched for one, its checksum.
func (r *run) verifyFile(ctx context.Context, idx int) error {
	f := r.listing.Files[idx]
	rel := filepath.FromSlash(f.Path)
	info, err := r.root.Stat(rel)
	if err != nil {
		return err
	}
	if info.Size() != f.Size {
		return &VerificationError{file: idx, Path: f.Path, Kind: "size", Want: fmt.Sprint(f.Size), Got: fmt.Sprint(info.Size())}
	}
	kind, want, h, encode := checker(f.Checksums, f.Size)
	if h == nil {
		// The source vouches for nothing but the size; record what was written, to re-verify
		// the file against later.
		return r.record(ctx, idx)
	}
	if crc, ok := r.combinedCRC(idx); ok {
		if got := r.inline[idx].encoder(crc); got != want {
			return &VerificationError{file: idx, Path: f.Path, Kind: kind, Want: want, Got: got}
		}
		return nil
	}
	file, err := r.root.Open(rel)
	if err != nil {
		return err
	}
	defer file.Close()
	bufp := chunkPool.Get().(*[]byte)
	defer chunkPool.Put(bufp)
	if err := hashFile(ctx, h, file, *bufp); err != nil {
		return fmt.Errorf("reading %s to verify it: %w", f.Path, err)
	}
	if got := encode(h.Sum(nil)); got != want {
		return &VerificationError{file: idx, Path: f.Path, Kind: kind, Want: want, Got: got}
	}
	return nil
}

// record computes file idx's CRC64NVME from its parts' CRCs (or, after a resume with another
// part size, by reading it back) into r.recorded.
func (r *run) record(ctx context.Context, idx int) error {
	var b [8]byte
	if crc, ok := r.combinedCRC(idx); ok && r.inline[idx] == crc64NVMEKind {
		binary.BigEndian.PutUint64(b[:], crc)
		r.recorded[idx] = base64.StdEncoding.EncodeToString(b[:])
		return nil
	}
	file, err := r.root.Open(filepath.FromSlash(r.listing.Files[idx].Path))
	if err != nil {
		return err
	}
	defer file.Close()
	bufp := chunkPool.Get().(*[]byte)
	defer chunkPool.Put(bufp)
	h := crc64.New(crc64NVME)
	if err := hashFile(ctx, h, file, *bufp); err != nil {
		return fmt.Errorf("reading %s to record its checksum: %w", r.listing.Files[idx].Path, err)
	}
	r.recorded[idx] = base64.StdEncoding.EncodeToString(h.Sum(nil))
	return nil
}

func hashFile(ctx context.Context, h hash.Hash, f *os.File, buf []byte) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := f.Read(buf)
		h.Write(buf[:n])
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// CRC64NVME returns the S3 full-object CRC64NVME checksum of data, base64 as S3 sends it.
func CRC64NVME(data []byte) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], crc64.Checksum(data, crc64NVME))
	return base64.StdEncoding.EncodeToString(b[:])
}

// combinedCRC returns a file's CRC from its parts' CRCs, when the parts tile the file exactly
// (they may not after a resume with another part size: the file is then read back).
func (r *run) combinedCRC(idx int) (uint64, bool) {
	kind := r.inline[idx]
	if kind == nil {
		return 0, false
	}
	r.crcMu.Lock()
	parts := append([]partCRC(nil), r.crcs[idx]...)
	r.crcMu.Unlock()
	size := r.listing.Files[idx].Size
	if size == 0 {
		return kind.update(0, nil), true
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i].off < parts[j].off })
	var crc uint64
	var next int64
	for i, p := range parts {
		if p.off != next {
			return 0, false
		}
		if i == 0 {
			crc = p.crc
		} else {
			crc = kind.combine(crc, p.crc, p.n)
		}
		next += p.n
	}
	return crc, next == size
}
