package engine

import (
	"context"
	"crypto/md5"  //nolint:gosec // S3 ETags are MD5: this checks integrity, not authenticity
	"crypto/sha1" //nolint:gosec // git blob ids
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/minio/crc64nvme"
	"golang.org/x/time/rate"

	"github.com/prewarm/prewarm/pkg/engine/source"
)

// checker picks the checksum to verify a file with: sha256, then the S3 full-object CRCs
// (fast to compute, and as good as MD5 at catching damage), then SHA-1, MD5, the git blob id.
// A file with parts from peers is checked with c.Digests() only (verifyFile). It
// returns nil when the source gave none (size is then the only check). size is the file's.
func checker(c source.Checksums, size int64) (kind, want string, h hash.Hash, encode func([]byte) string) {
	hexEnc := hex.EncodeToString
	switch {
	case c.SHA256 != "":
		return "sha256", strings.ToLower(c.SHA256), sha256.New(), hexEnc
	case c.CRC64NVME != "":
		return "crc64nvme", c.CRC64NVME, crc64nvme.New(), base64.StdEncoding.EncodeToString
	case c.CRC32C != "":
		return "crc32c", c.CRC32C, crc32.New(crc32.MakeTable(crc32.Castagnoli)), base64.StdEncoding.EncodeToString
	case c.SHA1 != "":
		return "sha1", strings.ToLower(c.SHA1), sha1.New(), hexEnc //nolint:gosec // S3's SHA-1 checksums
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
	sums := f.Checksums
	switch {
	case r.tainted[idx].Load() && sums.Cryptographic():
		// Parts came from peers: a CRC of them proves nothing a lying peer could not arrange,
		// so only the source's digest decides, read back. (A file without a digest takes parts
		// from peers only with Request.TrustPeers: prepare.)
		sums = sums.Digests()
	case sums.Empty():
		// The source vouches for nothing but the size; record what was written, to re-verify
		// the file against later.
		return r.record(ctx, idx)
	default:
		if crc, ok := r.combinedCRC(idx); ok {
			kind, want, _, _ := checker(sums, f.Size)
			if got := r.inline[idx].encoder(crc); got != want {
				return &VerificationError{file: idx, Path: f.Path, Kind: kind, Want: want, Got: got}
			}
			return nil
		}
	}
	err = readAndCompare(ctx, r.root, f.Path, sums, f.Size, nil, nil)
	var verr *VerificationError
	if errors.As(err, &verr) {
		verr.file = idx
	}
	return err
}

// readAndCompare reads file path under root and compares it with the checksum c gives: nil, a
// *VerificationError, a *stopped error (cancelled, or out of time at lim's rate), or the
// error that kept it from being read. lim and read are hashFile's.
func readAndCompare(ctx context.Context, root *os.Root, path string, c source.Checksums, size int64, lim *rate.Limiter, read func(int64)) error {
	kind, want, h, encode := checker(c, size)
	if h == nil {
		return nil
	}
	file, err := root.Open(filepath.FromSlash(path))
	if err != nil {
		return err
	}
	defer file.Close()
	bufp := chunkPool.Get().(*[]byte)
	defer chunkPool.Put(bufp)
	if err := hashFile(ctx, h, file, *bufp, lim, read); err != nil {
		return fmt.Errorf("reading %s to verify it: %w", path, err)
	}
	if got := encode(h.Sum(nil)); got != want {
		return &VerificationError{Path: path, Kind: kind, Want: want, Got: got}
	}
	return nil
}

// record computes file idx's CRC64NVME from its parts' CRCs (or, after a resume with another
// part size, by reading it back) into r.recorded.
func (r *run) record(ctx context.Context, idx int) error {
	if crc, ok := r.combinedCRC(idx); ok { // files without checksums stream in with CRC64NVME (prepare)
		r.recorded[idx] = crc64NVMEKind.encoder(crc)
		return nil
	}
	file, err := r.root.Open(filepath.FromSlash(r.listing.Files[idx].Path))
	if err != nil {
		return err
	}
	defer file.Close()
	bufp := chunkPool.Get().(*[]byte)
	defer chunkPool.Put(bufp)
	h := crc64nvme.New()
	if err := hashFile(ctx, h, file, *bufp, nil, nil); err != nil {
		return fmt.Errorf("reading %s to record its checksum: %w", r.listing.Files[idx].Path, err)
	}
	r.recorded[idx] = base64.StdEncoding.EncodeToString(h.Sum(nil))
	return nil
}

// hashFile feeds f to h through buf. With lim, it reads at most lim's rate; read, when set, is
// told the bytes read so far. A cancelled context, or a rate that cannot finish before the
// context's deadline, ends it with a *stopped error.
func hashFile(ctx context.Context, h io.Writer, f *os.File, buf []byte, lim *rate.Limiter, read func(int64)) error {
	if lim != nil && lim.Burst() < len(buf) {
		buf = buf[:max(1, lim.Burst())]
	}
	var total int64
	for {
		if lim != nil {
			if err := lim.WaitN(ctx, len(buf)); err != nil {
				return &stopped{err}
			}
		} else if err := ctx.Err(); err != nil {
			return &stopped{err}
		}
		n, err := f.Read(buf)
		_, _ = h.Write(buf[:n]) // a hash never fails to write
		total += int64(n)
		if read != nil {
			read(total)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// stopped is a read that ended before it could decide: cancelled, or past its deadline.
type stopped struct{ err error }

func (s *stopped) Error() string { return s.err.Error() }
func (s *stopped) Unwrap() error { return s.err }

// CRC64NVME returns the S3 full-object CRC64NVME checksum of data, base64 as S3 sends it.
func CRC64NVME(data []byte) string {
	return crc64NVMEKind.encoder(crc64nvme.Checksum(data))
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
