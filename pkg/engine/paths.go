package engine

import (
	"fmt"
	"path"
	"strings"

	"github.com/prewarm/prewarm/pkg/engine/source"
)

// Reserved names: prewarm's own entries in a destination start with this.
const reservedPrefix = ".prewarm"

const (
	manifestName = ManifestName
	journalName  = ".prewarm-journal"
)

// maxNameBytes is the longest name of a file or directory Linux file systems store (NAME_MAX).
const maxNameBytes = 255

// checkPaths refuses a listing whose paths would leave the destination, collide or cannot be
// stored: absolute paths, "..", ".", empty segments, NUL bytes, names over maxNameBytes,
// prewarm's reserved names, duplicates, and a file that is also another file's directory.
func checkPaths(files []source.File) error {
	seen := make(map[string]bool, len(files))
	for _, f := range files {
		p := f.Path
		switch {
		case p == "":
			return fmt.Errorf("the source lists a file with an empty name")
		case strings.ContainsRune(p, 0):
			return fmt.Errorf("refusing file %q: NUL in the name", p)
		case strings.HasPrefix(p, "/"):
			return fmt.Errorf("refusing file %q: absolute path", p)
		case path.Clean(p) != p:
			return fmt.Errorf("refusing file %q: not a clean relative path", p)
		}
		for _, seg := range strings.Split(p, "/") {
			if seg == ".." || seg == "." {
				return fmt.Errorf("refusing file %q: %q would leave the destination", p, seg)
			}
			if len(seg) > maxNameBytes {
				return fmt.Errorf("refusing file %q: a name of %d bytes, and a file system takes at most %d", p, len(seg), maxNameBytes)
			}
		}
		if strings.HasPrefix(p, reservedPrefix) {
			return fmt.Errorf("refusing file %q: names starting with %s are prewarm's own", p, reservedPrefix)
		}
		if f.Size < 0 {
			return fmt.Errorf("refusing file %q: negative size %d", p, f.Size)
		}
		if seen[p] {
			return fmt.Errorf("the source lists %q twice", p)
		}
		seen[p] = true
	}
	for p := range seen {
		for dir := path.Dir(p); dir != "."; dir = path.Dir(dir) {
			if seen[dir] {
				return fmt.Errorf("the source lists %q both as a file and as the directory of %q", dir, p)
			}
		}
	}
	return nil
}

// ManifestName is the name of the manifest a published destination holds.
const ManifestName = ".prewarm-manifest.json"
