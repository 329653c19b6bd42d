package engine

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/prewarm/prewarm/pkg/engine/source"
)

// A run that resumes parts an earlier run took from peers trusts them no more than it would
// have then: a file no digest can check is fetched again unless peers are trusted, and one with
// a digest is checked by it and not offered before.
func TestResumedPeerPartsAreNotTrusted(t *testing.T) {
	const size = 1 << 20
	for _, tc := range []struct {
		name       string
		sums       source.Checksums
		trustPeers bool
		kept       bool
	}{
		{"no digest, peers not trusted", source.Checksums{}, false, false},
		{"no digest, peers trusted", source.Checksums{}, true, true},
		{"CRC only, peers not trusted", source.Checksums{CRC64NVME: "AAAAAAAAAAA="}, false, false},
		{"a digest", source.Checksums{SHA256: fmt.Sprintf("%064x", 1)}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dest := filepath.Join(t.TempDir(), "model")
			listing := source.Listing{Files: []source.File{{Path: "w.bin", Size: size, Version: "1", Checksums: tc.sums}}}
			dir := partialDir(dest)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "w.bin"), make([]byte, size), 0o644); err != nil {
				t.Fatal(err)
			}
			hdr, _ := json.Marshal(journalHeader{Plan: planHash(listing.Files, listing.Revision)})
			journal := fmt.Sprintf("%s\nP 0\nW 0 0 %d\nC 0 0 1234abcd\nS\n", hdr, size)
			if err := os.WriteFile(filepath.Join(dir, journalName), []byte(journal), 0o644); err != nil {
				t.Fatal(err)
			}
			e := New(WithPartSize(size), WithFreeSpace(func(string) (int64, error) { return 1 << 40, nil }))
			r, err := e.prepare(dest, nil, listing, tc.trustPeers, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer r.close()
			if kept := r.resume.written[0] != nil; kept != tc.kept {
				t.Fatalf("the resumed file kept: %v, want %v", kept, tc.kept)
			}
			if !tc.kept {
				return
			}
			if !r.tainted[0].Load() {
				t.Error("a file with parts from peers is not marked so: a CRC would verify it")
			}
			if _, held := r.plan.Held(0); held {
				t.Error("a peer's part is offered before its file is verified")
			}
		})
	}
}
