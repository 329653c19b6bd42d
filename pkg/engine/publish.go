package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// publish turns the verified partial directory into dest: the journal goes, the manifest is
// written, everything is synced, and one rename makes it visible.
func (r *run) publish(dest, sourceName string) error {
	if err := r.journal.close(); err != nil {
		return err
	}
	r.journal = nil
	if err := os.Remove(filepath.Join(r.dir, journalName)); err != nil {
		return err
	}
	m := Manifest{Version: 1, Source: sourceName, Revision: r.listing.Revision, Files: r.listing.Files, CompletedAt: r.e.now().UTC(),
		PartSize: r.plan.PartSize, PartCRC32C: make(map[string]string, len(r.listing.Files))}
	for i, f := range r.listing.Files {
		if err := r.fillPartCRCs(context.Background(), i); err != nil { // files verified by an earlier run
			return err
		}
		m.PartCRC32C[f.Path] = r.plan.partTable(i)
	}
	for i, f := range r.listing.Files {
		if !f.Checksums.Empty() {
			continue
		}
		if r.recorded[i] == "" { // verified by an earlier run of this download: read it back
			if err := r.record(context.Background(), i); err != nil {
				return err
			}
		}
		if m.Recorded == nil {
			m.Recorded = map[string]string{}
		}
		m.Recorded[f.Path] = r.recorded[i]
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(r.dir, manifestName), data, 0o644); err != nil {
		return err
	}
	dirFd, err := unix.Open(r.dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	err = unix.Syncfs(dirFd)
	unix.Close(dirFd)
	if err != nil {
		return fmt.Errorf("syncing %s: %w", r.dir, err)
	}

	// An earlier, different download in dest is moved aside, then removed: readers see the old
	// model or the new one, never a mix (a reader opening dest in between gets "not found").
	old := ""
	if _, err := os.Stat(dest); err == nil {
		if entries, _ := os.ReadDir(dest); len(entries) > 0 {
			old = filepath.Join(filepath.Dir(dest), "."+filepath.Base(dest)+".prewarm-old")
			if err := os.RemoveAll(old); err != nil {
				return err
			}
			if err := os.Rename(dest, old); err != nil {
				return err
			}
		}
	}
	if err := os.Rename(r.dir, dest); err != nil {
		return fmt.Errorf("publishing %s: %w", dest, err)
	}
	if err := syncDir(filepath.Dir(dest)); err != nil {
		return err
	}
	if old != "" {
		return os.RemoveAll(old)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
