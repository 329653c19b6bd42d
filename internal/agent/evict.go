package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent/cachejob"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/text"
	"github.com/prewarm/prewarm/pkg/engine"
)

// A cache root is kept between two watermarks. A download that would bring its filesystem past
// the high watermark (or into the reserve) first evicts other caches, in policy order, until,
// with it written, the disk is at the low watermark; a disk found above the high watermark
// (other files grew) has caches evicted until it is at the low one. Only a cache that is Ready
// may go, and never one that a pod on the node uses (by the pod list, by the mount table, or a
// mount under way), one that is pinned, or one of higher priority than the download that needs
// the room. The order: caches the node keeps only while retained (no longer a target) first,
// then the lowest priority, then the least recently used (last mounted by a pod, or first
// asked for). When evicting every such cache would not make room, nothing is evicted and the
// download fails with the figures.
//
// An evicted cache stays requested: its status says Evicted and why; it is fetched again when
// it fits under the low watermark without evicting anything, or at once when a pod on the node
// asks for it (which may evict others, by the same policy). A download of an evicted cache that no pod
// waits for never evicts: two caches that do not fit together do not take turns.

// diskFigures are a root's filesystem, as last measured, and its limits.
type diskFigures struct {
	// capacity, used and avail are the filesystem's size, what is in use (by anyone) and what
	// is free to write.
	capacity, used, avail int64
	reserve               int64
	high, low             int32
	// shares names what else uses the filesystem (the kubelet, the container runtime, the
	// node's system), when something does: used is then counted as the kubelet counts it, and
	// high stays clear of the kubelet's thresholds.
	shares string
}

// limit is the most the filesystem may hold once a cache is written.
func (f diskFigures) limit() int64 { return f.capacity * int64(f.high) / 100 }

// target is where eviction brings it.
func (f diskFigures) target() int64 { return f.capacity * int64(f.low) / 100 }

// room is what caches may still take without evicting.
func (f diskFigures) room() int64 {
	if f.capacity == 0 {
		return math.MaxInt64 // a filesystem that counts no blocks: nothing to check against
	}
	return max(0, min(f.avail-f.reserve, f.limit()-f.used))
}

// describe says, for people, where the disk stands.
func (f diskFigures) describe(root string) string { return f.describeFor(root, "caches", "") }

// describeFor says, for people, how full the filesystem is and to where those (caches, copies)
// may fill it; the reserve is named with reserveName.
func (f diskFigures) describeFor(fs, those, reserveName string) string {
	s := fmt.Sprintf("%s is %d%% full (%s of %s); %s may fill it to %d%%", fs, percent(f.used, f.capacity),
		engine.HumanBytes(f.used), engine.HumanBytes(f.capacity), those, f.high)
	if f.shares != "" {
		s += fmt.Sprintf(" (it is shared with %s: below the kubelet's thresholds)", f.shares)
	}
	if f.reserve > 0 {
		s += fmt.Sprintf(" and leave %s free%s", engine.HumanBytes(f.reserve), reserveName)
	}
	return s
}

func percent(n, of int64) int64 {
	if of <= 0 {
		return 0
	}
	return n * 100 / of
}

// figures measures root's filesystem. On a filesystem the kubelet or the container runtime
// also use, the watermarks are brought below the kubelet's thresholds (the gap between them
// kept), when the configuration's are not already lower.
func (a *Agent) figures(root string) (diskFigures, error) {
	r, _ := a.opts.Config.Root(root)
	f := diskFigures{reserve: a.opts.Reserve, high: r.HighWatermarkPercent, low: r.LowWatermarkPercent}
	if f.high == 0 {
		f.high = config.DefaultHighWatermarkPercent
	}
	if f.low == 0 {
		f.low = min(config.DefaultLowWatermarkPercent, f.high)
	}
	shares, err := a.checkDisk(root)
	if err != nil {
		shares = ""
	}
	if err := f.measure(a.opts.rootDir(root)); err != nil {
		return f, err
	}
	if shares != "" {
		f.shares = shares
		f.keepClearOf(a.kubelet)
		a.logShared(root, shares, f.high)
	}
	return f, nil
}

// measure fills in the filesystem's figures at dir.
func (f *diskFigures) measure(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return err
	}
	f.capacity = int64(st.Blocks) * st.Bsize
	f.used = int64(st.Blocks-st.Bfree) * st.Bsize
	f.avail = int64(st.Bavail) * st.Bsize
	return nil
}

// keepClearOf counts the filesystem as the kubelet does (used: all but what is available to
// write, the blocks kept for root included), and brings the watermarks below the kubelet's
// thresholds l when they are not already.
func (f *diskFigures) keepClearOf(l kubeletLimits) {
	f.used = max(f.used, f.capacity-f.avail)
	if kh := l.high(f.capacity); kh < f.high {
		gap := f.high - f.low
		f.high, f.low = kh, max(1, min(f.low, kh-gap))
	}
}

// rootOf returns the cache root whose directory holds dir, if any.
func (a *Agent) rootOf(dir string) (string, bool) {
	for _, root := range a.opts.Config.Roots() {
		if within(filepath.Clean(dir), filepath.Clean(a.opts.rootDir(root))) {
			return root, true
		}
	}
	return "", false
}

// space is what downloads under way were promised under the roots, and what the scratch copies
// were promised on the kubelet's filesystem: two downloads that each fit alone are not both let
// in when together they do not.
type space struct {
	mu     sync.Mutex
	claims map[string]claim // by cache UID
	// scratch are the scratch copies' claims, by cache UID: each holds until its copy is removed.
	scratch map[string]scratchClaim
}

// claim is the space promised to one download: need bytes under root, when its cache took at
// bytes on disk (what it writes since is taken from the promise).
type claim struct {
	root     string
	need, at int64
}

// claimSpace is the engine's question, for the downloads of cache uid of namespace ns, whether
// what is left to write fits under its cache root: in what caches may take without evicting,
// less what other downloads there were promised and have not written yet, and within the
// namespace's per-node limit, with its other caches and its copies (checkQuotaLocked). A scratch
// copy claims its room otherwise (claimScratch).
func (a *Agent) claimSpace(uid, ns string) engine.ClaimSpace {
	return func(dir string, need int64) (func(), error) {
		root, ok := a.rootOf(dir)
		if !ok {
			return nil, fmt.Errorf("%s is under no cache root", dir)
		}
		var peers []quotaPeer
		var refs map[string]types.NamespacedName
		if _, limited := a.opts.Config.PerNodeLimit(ns); limited {
			peers, refs = a.namespaceCaches(ns, uid), a.cacheRefs()
		}
		a.space.mu.Lock()
		defer a.space.mu.Unlock()
		var copies map[string]scratchUse
		if refs != nil {
			copies = a.scratchUsesLocked(refs)
		}
		if err := a.checkQuotaLocked(root, ns, uid, peers, copies, need); err != nil {
			return nil, err
		}
		_, free, err := a.freeForLocked(root, uid)
		if err != nil {
			return nil, err
		}
		if need > free {
			return nil, &engine.InsufficientSpaceError{Need: need, Free: free, Dir: dir}
		}
		a.space.claims[uid] = claim{root: root, need: need, at: a.cacheBytes(root, uid)}
		return func() {
			a.space.mu.Lock()
			delete(a.space.claims, uid)
			a.space.mu.Unlock()
		}, nil
	}
}

// freeFor is what cache uid may still take under root without evicting: what caches may take
// there, less what other downloads were promised and have not written yet.
func (a *Agent) freeFor(root, uid string) (diskFigures, int64, error) {
	a.space.mu.Lock()
	defer a.space.mu.Unlock()
	return a.freeForLocked(root, uid)
}

func (a *Agent) freeForLocked(root, uid string) (diskFigures, int64, error) {
	f, err := a.figures(root)
	if err != nil {
		return f, 0, err
	}
	free := f.room()
	for other, c := range a.space.claims {
		if other != uid && c.root == root {
			free -= max(0, c.need-(a.cacheBytes(root, other)-c.at))
		}
	}
	return f, max(0, free), nil
}

// cacheBytes is what cache uid's entries under root take on disk now.
func (a *Agent) cacheBytes(root, uid string) int64 {
	parent, err := a.opts.openCacheParent(root)
	if err != nil {
		return 0
	}
	defer parent.Close()
	var n int64
	for _, name := range entries(uid) {
		_ = iofs.WalkDir(parent.FS(), name, func(_ string, d iofs.DirEntry, err error) error {
			if err != nil {
				return nil // not there, or gone while walking
			}
			n += allocated(d)
			return nil
		})
	}
	return n
}

// errNoRoom says a download does not fit even after every eviction the policy allows.
type errNoRoom struct {
	root       string
	need, free int64 // free: what the download may take without evicting
	f          diskFigures
	evictable  int64
	kept       []string
}

func (e *errNoRoom) Error() string {
	s := fmt.Sprintf("needs %s more; %s: %s free for caches", engine.HumanBytes(e.need), e.f.describe(e.root), engine.HumanBytes(e.free))
	if promised := e.f.room() - e.free; promised > 0 && e.f.capacity > 0 {
		s += fmt.Sprintf(" besides the %s promised to downloads under way", engine.HumanBytes(promised))
	}
	s += fmt.Sprintf(", and evicting every cache the policy lets go would free %s", engine.HumanBytes(e.evictable))
	if len(e.kept) > 0 {
		s += " (kept: " + strings.Join(e.kept, ", ") + ")"
	}
	return s
}

// victim is a cache that may be evicted.
type victim struct {
	j        *cachejob.Job
	uid      string
	bytes    int64
	retained bool
	priority int32
	used     time.Time
}

// evictable lists the caches under root that may go to make room for by (nil: to bring the disk
// under its high watermark), in the order they go, and says of the others with files there why
// they stay. The caches' sizes are measured now.
func (a *Agent) evictable(ctx context.Context, root string, by *cachejob.Job) ([]victim, []string) {
	u := usage{byUID: map[string]int64{}}
	a.measure(root, &u)
	var out []victim
	var kept []string
	a.mu.Lock()
	for uid, j := range a.jobs {
		r := j.Current()
		if r.Root != root || (by != nil && uid == by.Request().UID) || u.byUID[uid] == 0 || a.isRemoving(uid) {
			continue
		}
		why := ""
		switch {
		case r.Pinned:
			why = "pinned"
		case by != nil && r.Priority > by.Current().Priority:
			why = fmt.Sprintf("priority %d", r.Priority)
		case a.publishing[uid] > 0:
			why = "being mounted"
		case j.State() != inferencev1.CacheReady:
			continue // checked, fetched or evicted: not a copy to evict
		}
		if why != "" {
			kept = append(kept, r.Namespace+"/"+r.Name+" "+why)
			continue
		}
		out = append(out, victim{j: j, uid: uid, bytes: u.byUID[uid], retained: r.RetainedSince != "", priority: r.Priority, used: j.LastUsed()})
	}
	a.mu.Unlock()
	// Whether a pod uses them, outside the lock (the pod list, the mount table): evict looks
	// again once the cache has stopped being Ready.
	out = slices.DeleteFunc(out, func(v victim) bool {
		pod, err := a.podUsing(ctx, v.uid, v.j.Request().Namespace)
		if err == nil && pod == "" {
			var mounted bool
			if mounted, err = a.cacheMounted(v.uid); mounted {
				pod = "a pod's volume"
			}
		}
		switch {
		case err != nil:
			kept = append(kept, fmt.Sprintf("%s/%s (%v)", v.j.Request().Namespace, v.j.Request().Name, err))
		case pod != "":
			kept = append(kept, fmt.Sprintf("%s/%s used by %s", v.j.Request().Namespace, v.j.Request().Name, pod))
		}
		return err != nil || pod != ""
	})
	slices.SortFunc(out, func(x, y victim) int {
		if x.retained != y.retained {
			if x.retained {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(x.priority, y.priority), x.used.Compare(y.used), strings.Compare(x.uid, y.uid))
	})
	slices.Sort(kept)
	return out, kept
}

// Why caches are evicted (the metric's reason label).
const (
	evictForRoom      = "MakeRoom"
	evictForWatermark = "HighWatermark"
)

// makeRoom evicts caches under by's root, by policy, so that need more bytes fit there, down to
// the low watermark, and holds the room for by until release is called (after its download):
// an evicted cache waiting for room does not take it first. It evicts nothing, and returns an
// *errNoRoom, when every cache the policy lets go would not be enough.
func (a *Agent) makeRoom(ctx context.Context, by *cachejob.Job, need int64) (freed int64, release func(), err error) {
	a.evicting.Lock()
	defer a.evicting.Unlock()
	root, uid := by.Request().Root, by.Request().UID
	a.space.mu.Lock()
	f, free, err := a.freeForLocked(root, uid)
	if err == nil {
		a.space.claims[uid] = claim{root: root, need: need, at: a.cacheBytes(root, uid)}
	}
	a.space.mu.Unlock()
	if err != nil {
		return 0, nil, err
	}
	release = func() {
		a.space.mu.Lock()
		delete(a.space.claims, uid)
		a.space.mu.Unlock()
	}
	freed, err = a.evictFor(ctx, by, need, f, free)
	if err != nil {
		release()
		return freed, nil, err
	}
	return freed, release, nil
}

// evictFor evicts what makeRoom needs, given the disk's figures and what by may take now.
func (a *Agent) evictFor(ctx context.Context, by *cachejob.Job, need int64, f diskFigures, free int64) (int64, error) {
	root := by.Request().Root
	must := need - free
	if must <= 0 {
		return 0, nil // room now (another cache went meanwhile)
	}
	promised := max(0, f.room()-free) // to downloads under way, not written yet
	want := max(must, f.used+promised+need-f.target())
	victims, kept := a.evictable(ctx, root, by)
	var all int64
	for _, v := range victims {
		all += v.bytes
	}
	if all < must {
		return 0, &errNoRoom{root: root, need: need, free: free, f: f, evictable: all, kept: kept}
	}
	r := by.Current()
	why := fmt.Sprintf("evicted to make room for cache %s/%s (%s more): %s", r.Namespace, r.Name, engine.HumanBytes(need), f.describe(root))
	freed := a.evictUntil(ctx, victims, want, evictForRoom, why)
	if freed < must {
		f, free, _ = a.freeFor(root, by.Request().UID)
		return freed, &errNoRoom{root: root, need: need, free: free, f: f, evictable: all - freed, kept: kept}
	}
	return freed, nil
}

// keepUnderWatermarks evicts caches, by policy, from each root whose disk is above its high
// watermark, until it is at its low one.
func (a *Agent) keepUnderWatermarks(ctx context.Context) {
	for _, root := range a.opts.Config.Roots() {
		f, err := a.figures(root)
		if err != nil || f.capacity == 0 || f.used <= f.limit() && f.avail >= f.reserve {
			continue
		}
		a.evicting.Lock()
		victims, _ := a.evictable(ctx, root, nil)
		why := fmt.Sprintf("evicted to bring the disk under its high watermark: %s", f.describe(root))
		a.evictUntil(ctx, victims, max(f.used-f.target(), f.reserve-f.avail), evictForWatermark, why)
		a.evicting.Unlock()
	}
}

// evictUntil evicts victims in turn until want bytes are freed, and returns what was.
func (a *Agent) evictUntil(ctx context.Context, victims []victim, want int64, reason, why string) int64 {
	var freed int64
	for _, v := range victims {
		if freed >= want {
			break
		}
		if a.evict(ctx, v, reason, why) {
			freed += v.bytes
		}
	}
	return freed
}

// evict removes v's model from the node, unless a pod uses it or its job is busy with it, and
// reports whether it did. The cache stops being Ready before the pods and the mount table are
// looked at, under the lock the node plugin takes to hand out a mount: a mount either began
// before (it is counted, or it is in the mount table) or finds the cache not Ready and waits
// for it to be fetched again. The model is renamed before it is removed, so a half-removed
// directory never carries its name.
func (a *Agent) evict(ctx context.Context, v victim, reason, why string) bool {
	log := ctrl.LoggerFrom(ctx).WithValues("cache", v.uid)
	j := v.j
	release, ok := j.TryWork()
	if !ok {
		return false // checking or fetching it right now
	}
	defer release()
	a.mu.Lock()
	before := j.Snapshot()
	if a.publishing[v.uid] > 0 || before.State != inferencev1.CacheReady || a.isRemoving(v.uid) {
		a.mu.Unlock()
		return false
	}
	j.Set(func(st *prewarmv1alpha1.CacheStatus) {
		st.State, st.Reason, st.BytesDone, st.BytesPerSecond = inferencev1.CachePending, prewarmv1alpha1.ReasonEvicted, 0, 0
		st.Message = text.Clip(why+"; fetched again when there is room, or when a pod on the node asks for it", text.MaxMessage)
	})
	a.mu.Unlock()
	pod, err := a.podUsing(ctx, v.uid, j.Request().Namespace)
	if err == nil && pod == "" {
		var mounted bool
		if mounted, err = a.cacheMounted(v.uid); err == nil && mounted {
			pod = "(a pod's volume, still mounted)"
		}
	}
	if err != nil || pod != "" {
		j.Set(func(st *prewarmv1alpha1.CacheStatus) { *st = before })
		log.V(1).Info("not evicting a cache a pod uses", "pod", pod, "error", err)
		return false
	}
	a.withdraw(v.uid) // no part of it is offered to peers any more
	j.SetEvicted(why)
	dir, err := a.opts.ensureCacheDir(j.Request().Root, v.uid)
	if err == nil {
		model := filepath.Join(dir, prewarmv1alpha1.ModelSubdir)
		gone := filepath.Join(dir, setAsidePrefix+"evicted-"+strconv.FormatInt(a.opts.Now().UnixNano(), 10))
		if err = os.Rename(model, gone); err == nil {
			err = os.RemoveAll(gone) // what a crash leaves is swept like any copy set aside
		}
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Error(err, "evicting the cache")
	}
	a.metrics.evictions.WithLabelValues(reason).Inc()
	log.Info("evicted cache", "reason", reason, "bytes", v.bytes, "why", why)
	return true
}

// firstUsed is when the cache was last used by an earlier run of the agent (its directory's
// time), or now.
func (a *Agent) firstUsed(r prewarmv1alpha1.CacheRequest) time.Time {
	if info, err := os.Stat(prewarmv1alpha1.CacheDir(a.opts.rootDir(r.Root), r.UID)); err == nil {
		return info.ModTime()
	}
	return a.opts.Now()
}

// watermarkKeeper looks at the disks every watermarkInterval (ProgressInterval when shorter)
// and brings those above their high watermark down to their low one.
type watermarkKeeper struct{ a *Agent }

// watermarkInterval is the longest time between two looks at the disks: a large fleet raises
// ProgressInterval to write progress less often, and that must not let others' files fill a
// disk for longer.
const watermarkInterval = 10 * time.Second

// NeedLeaderElection is false: every node's agent keeps its own disks.
func (watermarkKeeper) NeedLeaderElection() bool { return false }

func (w watermarkKeeper) Start(ctx context.Context) error {
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithName("evict"))
	for {
		w.a.keepUnderWatermarks(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(min(w.a.opts.ProgressInterval, watermarkInterval)):
		}
	}
}
