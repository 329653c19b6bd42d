package agent

import (
	iofs "io/fs"
	"strings"
	"sync"
	"syscall"
	"time"
)

// usage is what prewarm's files take under one root, as last measured.
type usage struct {
	at    time.Time
	total int64
	// byUID is what each cache's directory takes: its copy, its partial download and the
	// copies set aside while pods mount them.
	byUID map[string]int64
}

// usages remembers each root's last measurement.
type usages struct {
	mu     sync.Mutex
	byRoot map[string]usage
}

// rootUsage is what prewarm's files take under root, measured at most every progressInterval
// (it is a figure of progress, like the bytes downloaded): a walk of the caches' directories,
// cheap for a model's few hundred files but not worth every status tick.
// A root the agent cannot read yet (no cache was ever kept there) takes nothing.
func (a *Agent) rootUsage(root string) usage {
	now := a.opts.Now()
	a.usages.mu.Lock()
	u, ok := a.usages.byRoot[root]
	a.usages.mu.Unlock()
	if ok && now.Sub(u.at) < a.opts.ProgressInterval {
		return u
	}
	u = usage{at: now, byUID: map[string]int64{}}
	a.measure(root, &u)
	a.usages.mu.Lock()
	a.usages.byRoot[root] = u
	a.usages.mu.Unlock()
	return u
}

// measure walks <root>/prewarm through an os.Root (a link is counted, never followed) and sums
// the blocks each entry allocates, by the cache it belongs to.
func (a *Agent) measure(root string, u *usage) {
	parent, err := a.opts.openCacheParent(root)
	if err != nil {
		return
	}
	defer parent.Close()
	_ = iofs.WalkDir(parent.FS(), ".", func(path string, d iofs.DirEntry, err error) error {
		if err != nil || path == "." {
			return nil // gone while walking (a removal, a publish): not counted; "." is the walk's start
		}
		top, _, _ := strings.Cut(path, "/")
		uid := entryUID(top)
		if uid == "" { // not prewarm's: someone else put it there
			if d.IsDir() {
				return iofs.SkipDir
			}
			return nil
		}
		n := allocated(d)
		u.byUID[uid] += n
		u.total += n
		return nil
	})
}

// allocated is what an entry takes on disk: its blocks, not its length (sparse, preallocated).
func allocated(d iofs.DirEntry) int64 {
	info, err := d.Info()
	if err != nil {
		return 0 // gone meanwhile
	}
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return info.Size()
}
