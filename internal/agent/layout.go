package agent

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"path/filepath"
	"slices"
	"strings"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/pkg/engine"
)

// removeDirs deletes <root>/prewarm/<uid> (and what earlier layouts left beside it) under each
// allowed root. Removal goes through an os.Root of <root>/prewarm: a link in the way is removed,
// never followed.
func (a *Agent) removeDirs(uid string) error {
	if !uidPattern.MatchString(uid) {
		return fmt.Errorf("refusing to remove %q: not a cache UID", uid)
	}
	var errs []error
	for _, root := range a.opts.Config.Roots() {
		parent, err := a.opts.openCacheParent(root)
		if errors.Is(err, iofs.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, name := range entries(uid) {
			if err := parent.RemoveAll(name); err != nil {
				errs = append(errs, err)
			}
		}
		parent.Close()
	}
	return errors.Join(errs...)
}

// entries are the names cache uid may have under <root>/prewarm: its directory, and what earlier
// layouts and an interrupted migration leave beside it (the partial download, now inside the
// cache directory, was once beside it).
func entries(uid string) []string {
	return []string{uid, "." + uid + ".prewarm-partial", "." + uid + ".prewarm-migrate"}
}

// entryUID returns the cache UID an entry under <root>/prewarm belongs to (one of its
// entries), or "".
func entryUID(name string) string {
	uid, _, _ := strings.Cut(strings.TrimPrefix(name, "."), ".prewarm-")
	if !uidPattern.MatchString(uid) || !slices.Contains(entries(uid), name) {
		return ""
	}
	return uid
}

// migrateLayout moves a cache of the earlier layout (the model's files directly in
// <root>/prewarm/<uid>) to <root>/prewarm/<uid>/model, with renames only: nothing is fetched
// again.
func (a *Agent) migrateLayout(root, uid string) error {
	parent, err := a.opts.openCacheParent(root)
	if errors.Is(err, iofs.ErrNotExist) {
		return nil // a node that holds no cache yet
	}
	if err != nil {
		return err
	}
	defer parent.Close()
	tmp := entries(uid)[2] // .<uid>.prewarm-migrate
	if _, err := parent.Lstat(filepath.Join(uid, engine.ManifestName)); err == nil {
		if err := parent.Rename(uid, tmp); err != nil {
			return err
		}
	}
	if _, err := parent.Lstat(tmp); err != nil {
		return nil // the current layout, or nothing yet
	}
	if err := parent.Mkdir(uid, 0o755); err != nil && !errors.Is(err, iofs.ErrExist) {
		return err
	}
	return parent.Rename(tmp, filepath.Join(uid, prewarmv1alpha1.ModelSubdir))
}
