package agent

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/prewarm/prewarm/pkg/engine"
)

// A scratch copy is kept on the kubelet's filesystem, which the kubelet and the container
// runtime need: at their defaults the kubelet removes images from 85 % used and evicts the
// node's pods from 90 %. So a copy claims its room before it writes anything, as a cache's
// download does, and the claim is recorded at once, so that two copies that each fit alone are
// not both let in when together they do not. The copy is refused, writing nothing, unless with
// it written (and what the node's other copies were promised):
//
//   - its namespace's caches and copies on the node stay within the namespace's per-node limit
//     (namespaceQuotas[].maxBytesPerNode; a cache refused for that limit gets no copy begun at
//     all, scratchToMount);
//   - the node's copies together stay within agent.maxScratchBytes;
//   - the kubelet's filesystem stays below the kubelet's eviction and image garbage collection
//     thresholds, less a margin (agent.kubelet; kubelet.go), and agent.reserve free.
//
// The claim holds until the copy is removed. A refused copy is tried again with the backoff of
// failed downloads, and at once when a cache or copy leaves the node; meanwhile the pod's mount
// is refused with the figures (and a CacheRefused event), and the kubelet keeps asking.

// scratchClaim is the room promised to one scratch copy: need bytes more than the at bytes its
// files took when it claimed.
type scratchClaim struct {
	ns       string
	need, at int64
}

// scratchUse is what one scratch copy takes on the kubelet's filesystem, or was promised.
type scratchUse struct {
	ns, cache string // the cache's namespace ("" when not known) and namespace/name (else its UID)
	// live is what its files take; trash what those of a copy of it being removed take.
	live, trash int64
	claim       *scratchClaim
}

// held is what the copy counts for: what it takes, or what it was promised when more.
func (u scratchUse) held() int64 {
	n := u.live
	if u.claim != nil {
		n = max(n, u.claim.at+u.claim.need)
	}
	return n + u.trash
}

// promised is what the copy was promised and has not written yet.
func (u scratchUse) promised() int64 {
	if u.claim == nil {
		return 0
	}
	return max(0, u.claim.at+u.claim.need-u.live)
}

// cacheRefs names the node's caches by UID.
func (a *Agent) cacheRefs() map[string]types.NamespacedName {
	a.mu.Lock()
	defer a.mu.Unlock()
	refs := make(map[string]types.NamespacedName, len(a.jobs))
	for uid, j := range a.jobs {
		refs[uid] = types.NamespacedName{Namespace: j.Request().Namespace, Name: j.Request().Name}
	}
	return refs
}

// scratchUsesLocked measures the scratch copies on the node, by cache UID: those on disk (left by
// an earlier run of the agent too, or being removed) and those claimed (a.space.mu held). refs
// names their caches.
func (a *Agent) scratchUsesLocked(refs map[string]types.NamespacedName) map[string]scratchUse {
	uses := map[string]scratchUse{}
	if a.opts.KubeletDir == "" {
		return uses
	}
	root := a.opts.scratchDir()
	entries, _ := os.ReadDir(root) // none yet: nothing on disk
	for _, e := range entries {
		uid, removing := scratchEntry(e.Name())
		if uid == "" {
			continue
		}
		u := uses[uid]
		if n := treeBytes(filepath.Join(root, e.Name())); removing {
			u.trash += n
		} else {
			u.live += n
		}
		uses[uid] = u
	}
	for uid, c := range a.space.scratch {
		u := uses[uid]
		u.claim = &c
		uses[uid] = u
	}
	for uid, u := range uses {
		if ref, ok := refs[uid]; ok {
			u.ns, u.cache = ref.Namespace, ref.String()
		}
		if u.claim != nil {
			u.ns = u.claim.ns
		}
		if u.cache == "" {
			u.cache = uid
		}
		uses[uid] = u
	}
	return uses
}

// scratchEntry returns the cache UID of an entry of the scratch directory, and whether it is a
// copy being removed ("" when it is not a copy).
func scratchEntry(name string) (string, bool) {
	if uidPattern.MatchString(name) {
		return name, false
	}
	if rest, ok := strings.CutPrefix(name, trashPrefix); ok && len(rest) > 36 && uidPattern.MatchString(rest[:36]) {
		return rest[:36], true
	}
	return "", false
}

// treeBytes is what the files under dir take on disk.
func treeBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d iofs.DirEntry, err error) error {
		if err == nil {
			n += allocated(d)
		}
		return nil // not there, or gone while walking
	})
	return n
}

// errNoScratchRoom says a scratch copy does not fit where copies may go.
type errNoScratchRoom struct{ msg string }

func (e *errNoScratchRoom) Error() string { return e.msg }

// claimScratch is the engine's question, for scratch copy s, whether what is left to write fits
// (see above). The room is promised to s until s is removed (releaseScratch): the release the
// engine gets does nothing.
func (a *Agent) claimScratch(s *scratch) engine.ClaimSpace {
	return func(_ string, need int64) (func(), error) {
		if err := a.claimScratchRoom(s, need); err != nil {
			return nil, err
		}
		a.scratches.update(s, func(st *scratchState) { st.err = nil }) // no longer refused: downloading
		return func() {}, nil
	}
}

// claimScratchRoom promises need bytes more to scratch copy s, and makes its directory, or says
// why they do not fit (an *errNoScratchRoom).
func (a *Agent) claimScratchRoom(s *scratch, need int64) error {
	refs := a.cacheRefs()
	limit, limited := a.opts.Config.PerNodeLimit(s.ns)
	var peers []quotaPeer
	if limited {
		peers = a.namespaceCaches(s.ns, "")
	}
	a.space.mu.Lock()
	defer a.space.mu.Unlock()
	uses := a.scratchUsesLocked(refs)
	own := uses[s.uid]
	delete(uses, s.uid) // its claim, if any, is made anew
	size := own.live + need
	name := s.uid
	if ref, ok := refs[s.uid]; ok {
		name = ref.String()
	}
	what := fmt.Sprintf("a copy of cache %s for its pods", name)
	if limited {
		if held, others := a.namespaceHeldLocked(s.ns, peers, uses, s.uid); held+size > limit.Bytes {
			e := &errOverBudget{ns: s.ns, limit: limit, what: what, size: size, held: held, others: others}
			return &errNoScratchRoom{e.Error()}
		}
	}
	var held, promised int64
	for _, u := range uses {
		held, promised = held+u.held(), promised+u.promised()
	}
	if bound := a.opts.Config.Agent.MaxScratchBytesValue(); held+own.trash+size > bound {
		return &errNoScratchRoom{fmt.Sprintf("the copies this node makes for its pods may take %s together (agent.maxScratchBytes); the node's other copies take %s, and %s needs %s more",
			engine.HumanBytes(bound), engine.HumanBytes(held+own.trash), what, engine.HumanBytes(size))}
	}
	f, err := a.kubeletFigures()
	if err != nil {
		return err
	}
	if free := max(0, f.room()-promised); need > free {
		msg := fmt.Sprintf("%s: %s free for copies", f.describeKubelet(a.opts.KubeletDir), engine.HumanBytes(free))
		if promised > 0 && f.capacity > 0 {
			msg += fmt.Sprintf(" besides the %s promised to other copies being downloaded", engine.HumanBytes(promised))
		}
		return &errNoScratchRoom{msg + fmt.Sprintf(", and %s needs %s more", what, engine.HumanBytes(need))}
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return err
	}
	a.space.scratch[s.uid] = scratchClaim{ns: s.ns, need: need, at: own.live}
	return nil
}

// releaseScratch gives back the room promised to the scratch copy of cache uid: it is gone.
func (a *Agent) releaseScratch(uid string) {
	a.space.mu.Lock()
	delete(a.space.scratch, uid)
	a.space.mu.Unlock()
}

// kubeletFigures measures the kubelet's filesystem, against the limits of scratch copies: the
// kubelet's thresholds, as for a cache root on its disk. It is measured where the copies go (the
// nearest directory of theirs that exists): the agent mounts the kubelet's directories it uses,
// not the kubelet's whole directory.
func (a *Agent) kubeletFigures() (diskFigures, error) {
	f := diskFigures{reserve: a.opts.Reserve, high: 100, low: 100}
	dir := a.opts.scratchDir()
	for {
		err := f.measure(dir)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.ENOENT) || dir == a.opts.KubeletDir || filepath.Dir(dir) == dir {
			return f, fmt.Errorf("measuring the kubelet's filesystem at %s: %w", dir, err)
		}
		dir = filepath.Dir(dir)
	}
	f.keepClearOf(a.kubelet)
	return f, nil
}

// describeKubelet says, for people, where the kubelet's filesystem stands.
func (f diskFigures) describeKubelet(dir string) string {
	return f.describeFor("the kubelet's filesystem ("+dir+")", "copies", " (agent.reserve)")
}

// wakeScratches gets the scratch copies that were refused room out of their wait, to claim it
// again now: a cache or a copy left the node.
func (a *Agent) wakeScratches() { a.scratches.wakeRefused() }
