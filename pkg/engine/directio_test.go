package engine_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/source"
)

// takesDirectIO reports whether the filesystem under dir opens files with O_DIRECT.
func takesDirectIO(t *testing.T, dir string) bool {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, "probe"), os.O_CREATE|os.O_WRONLY|unix.O_DIRECT, 0o644)
	if errors.Is(err, unix.EINVAL) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	return true
}

func directBytes(t *testing.T, reg *prometheus.Registry) int64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "prewarm_engine_direct_written_bytes_total" {
			return int64(mf.GetMetric()[0].GetCounter().GetValue())
		}
	}
	t.Fatal("no prewarm_engine_direct_written_bytes_total")
	return 0
}

// Files verified inline are written with O_DIRECT, all but the tail that is not a whole page;
// files read back to verify go through the page cache; a filesystem that refuses O_DIRECT
// (ramfs: run this package with TMPDIR there, as make test does) gets the page cache for all,
// with the same files. A read that breaks off mid-page costs that page, not the rest of the
// part.
func TestDirectWritesWhereTheFilesystemTakesThem(t *testing.T) {
	dir := t.TempDir()
	direct := takesDirectIO(t, dir)
	crcFile := gen.Bytes(1, 3<<20+12345)
	shaFile := gen.Bytes(2, 1<<20+100)
	files := map[string][]byte{"a.bin": crcFile, "b.bin": shaFile, "c.json": []byte(`{}`)}
	src := newMemSource(files)
	src.sums["a.bin"] = source.Checksums{CRC64NVME: engine.CRC64NVME(crcFile)}
	sha := sha256.Sum256(shaFile)
	src.sums["b.bin"] = source.Checksums{SHA256: hex.EncodeToString(sha[:])}
	// The first read of a.bin's second part breaks off 1000 bytes into a page.
	const cut = 256<<10 + 8192 + 1000
	var once atomic.Bool
	src.fault = func(path string, off, n int64) (int64, error) {
		if path == "a.bin" && off == 256<<10 && once.CompareAndSwap(false, true) {
			return cut - off, syscall.ECONNRESET
		}
		return n, nil
	}
	reg := prometheus.NewRegistry()
	dest := filepath.Join(dir, "m")
	if _, err := testEngine(engine.WithRegisterer(reg)).Fetch(context.Background(), engine.Request{Source: src, Dest: dest}); err != nil {
		t.Fatal(err)
	}
	if direct && onDisk(t, dir) { // before anything reads it
		if n := residentPages(t, filepath.Join(dest, "a.bin")); n > 2 {
			t.Errorf("%d pages of a.bin in the page cache after direct writes; want the tail and the cut page at most", n)
		}
	}
	assertTree(t, dest, files)
	want := int64(0)
	if direct {
		want = int64(len(crcFile))&^4095 - 4096 // the cut page went through the page cache
	}
	if got := directBytes(t, reg); got != want {
		t.Errorf("%d bytes written directly; want %d (filesystem takes O_DIRECT: %v)", got, want, direct)
	}
}

func TestDirectIOOff(t *testing.T) {
	files := modelFiles()
	reg := prometheus.NewRegistry()
	dest := filepath.Join(t.TempDir(), "m")
	if _, err := testEngine(engine.WithRegisterer(reg), engine.WithDirectIO(false)).Fetch(context.Background(), engine.Request{Source: newMemSource(files), Dest: dest}); err != nil {
		t.Fatal(err)
	}
	assertTree(t, dest, files)
	if got := directBytes(t, reg); got != 0 {
		t.Errorf("%d bytes written directly with direct I/O off", got)
	}
}

// onDisk reports whether dir is on a disk filesystem (ext4, xfs, btrfs) rather than in memory.
func onDisk(t *testing.T, dir string) bool {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	switch st.Type {
	case unix.EXT4_SUPER_MAGIC, unix.XFS_SUPER_MAGIC, unix.BTRFS_SUPER_MAGIC:
		return true
	}
	return false
}

// residentPages counts the pages of path in the page cache (mincore).
func residentPages(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(info.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Munmap(m) }()
	vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}
