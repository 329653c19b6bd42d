package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent/cachejob"
	"github.com/prewarm/prewarm/internal/cacheref"
	"github.com/prewarm/prewarm/internal/text"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/source"
)

// Reasons of the events the agent records on pods whose model volume it serves.
const (
	EventCacheMounted = "CacheMounted"
	EventCacheFilling = "CacheFilling"
	EventCacheRefused = "CacheRefused"
	EventCacheWaiting = "CacheWaiting"
	// EventCacheDamaged: re-verification found files of a cache the pod uses damaged on disk;
	// they are fetched again, and what the pod read of them before may have been damaged.
	EventCacheDamaged = "CacheDamaged"
	// EventSourceMounted and EventSourceRefused: an FSx directory volume (a cold pod's source)
	// was mounted, or refused.
	EventSourceMounted = "SourceMounted"
	EventSourceRefused = "SourceRefused"
)

// MountRequest is what a kubelet asks of the node plugin for one pod's model volume.
type MountRequest struct {
	// CacheUID is the cache the volume names (its volume attribute), or, for a volume that
	// names its cache by name, the cache CacheByName resolved that name to.
	CacheUID string
	// CacheName is the name the volume gives its cache by (volume attribute cache): a
	// ModelWeightsCacheConfig of the pod's namespace.
	CacheName string
	// FileSystemID and FSxPath are, for a volume that names an FSx directory instead of a
	// cache, the file system and the directory in it (its volume attributes).
	FileSystemID, FSxPath string
	// Pod is the pod, from the pod info the kubelet passes (podInfoOnMount).
	PodNamespace, PodName string
	PodUID                types.UID
}

// CacheByName resolves the cache req names by name (req.CacheName) in the pod's namespace, and
// returns req naming it by UID too: from there a volume by name is served exactly as one by UID
// (the same tenant check, fill on a miss, demand and cold copy). The name is looked up only in
// the namespace the kubelet gives as the pod's (podInfoOnMount), never in the one a pod might
// write: a pod of another namespace naming a cache finds its own namespace's, or none.
func (a *Agent) CacheByName(ctx context.Context, req MountRequest) (MountRequest, error) {
	if req.PodNamespace == "" {
		return req, a.refuse(req, codes.InvalidArgument, "no pod namespace in the volume context: the CSIDriver must have podInfoOnMount: true")
	}
	uid, err := a.names.resolve(ctx, a.client, req.PodNamespace, req.CacheName)
	switch {
	case errors.Is(err, cacheref.ErrInvalid):
		return req, a.refuse(req, codes.InvalidArgument, text.Clip(fmt.Sprintf("volume attribute %s: %v", prewarmv1alpha1.VolumeAttributeCache, err), text.MaxMessage))
	case errors.Is(err, cacheref.ErrNotFound):
		// Another namespace's cache of that name is no answer: refused, with a Warning, though
		// the kubelet asks again (the namespace may make one).
		return req, a.refuseAs(req, codes.NotFound, corev1.EventTypeWarning, EventCacheRefused, err.Error())
	case err != nil:
		return req, a.refuse(req, codes.Unavailable, err.Error())
	}
	req.CacheUID = uid
	return req, nil
}

// cache names the cache req mounts for people: its UID, after the name the pod gave it by.
func (req MountRequest) cache() string {
	if req.CacheName != "" {
		return req.CacheName + " (" + req.CacheUID + ")"
	}
	return req.CacheUID
}

// ModelToMount returns the directory of the verified model that req may mount, or a gRPC
// status error saying why not (yet). A cache that the node holds for the pod's namespace but
// has not finished is downloaded now, ahead of the others (fill on a miss); a cache the node
// was not asked for is reported as the pod's demand, and the controller asks the node for it
// when the pod's namespace is the cache's. ModelToMount waits for either for up to MountWait
// (less than the kubelet's own two-minute limit on the call), then answers Unavailable with the
// progress: the kubelet calls again, and the pod never sees a partial cache.
func (a *Agent) ModelToMount(ctx context.Context, req MountRequest) (string, error) {
	wait := a.opts.MountWait
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl)-5*time.Second)
	}
	deadline := time.Now().Add(wait)
	for {
		dir, again, err := a.modelToMount(ctx, req)
		if !again || !time.Now().Before(deadline) {
			return dir, err
		}
		select {
		case <-ctx.Done():
			return "", err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// modelToMount is one look at whether req may mount its model; again says the answer may
// change by itself soon (a download, the controller's request).
func (a *Agent) modelToMount(ctx context.Context, req MountRequest) (dir string, again bool, err error) {
	if req.CacheUID == "" {
		return "", false, a.refuse(req, codes.InvalidArgument, fmt.Sprintf("the volume names no cache: give volume attribute %s (a ModelWeightsCacheConfig of the pod's namespace) or %s",
			prewarmv1alpha1.VolumeAttributeCache, prewarmv1alpha1.VolumeAttributeCacheUID))
	}
	if !uidPattern.MatchString(req.CacheUID) {
		return "", false, a.refuse(req, codes.InvalidArgument, fmt.Sprintf("volume attribute %s=%q is not a cache UID", prewarmv1alpha1.VolumeAttributeCacheUID, req.CacheUID))
	}
	if req.PodNamespace == "" {
		return "", false, a.refuse(req, codes.InvalidArgument, "no pod namespace in the volume context: the CSIDriver must have podInfoOnMount: true")
	}
	a.mu.Lock()
	j, ok := a.jobs[req.CacheUID]
	removing := a.isRemoving(req.CacheUID)
	a.mu.Unlock()
	if !ok {
		if removing {
			return "", true, a.refuse(req, codes.Unavailable, fmt.Sprintf("cache %s is being removed from node %s; it is fetched again if the controller asks for it", req.cache(), a.opts.NodeName))
		}
		// Either a cache this node is not a target of yet (the agent reports the pod's demand;
		// the controller then asks the node for it, if the pod's namespace is the cache's), or
		// no cache at all: the agent cannot tell whose it is, so it mounts nothing.
		return "", true, a.refuse(req, codes.NotFound, fmt.Sprintf(
			"node %s has not been asked to hold cache %s: waiting for the controller, which asks for it when namespace %s has that cache", a.opts.NodeName, req.cache(), req.PodNamespace))
	}
	r := j.Current()
	if r.Namespace != req.PodNamespace {
		return "", false, a.refuse(req, codes.PermissionDenied, fmt.Sprintf("cache %s is not a cache of namespace %s: its pods may mount only their own namespace's caches", req.CacheUID, req.PodNamespace))
	}
	st := j.Snapshot()
	if st.State == inferencev1.CacheFailed && runsCold(st.Reason) {
		return a.scratchToMount(ctx, req, j, st)
	}
	if st.State != inferencev1.CacheReady {
		return "", st.State != inferencev1.CacheFailed || !prewarmv1alpha1.Terminal(st.Reason), a.fill(req, j, st)
	}
	if err := j.CheckCredentials(ctx); err != nil {
		if errors.Is(err, source.ErrAccessDenied) {
			if r.Credentials == nil {
				return "", false, a.refuse(req, codes.PermissionDenied, fmt.Sprintf(
					"namespace %s has no working token for %s, and the origin refuses to read it without one: %v", r.Namespace, r.Source, err))
			}
			return "", false, a.refuse(req, codes.PermissionDenied, fmt.Sprintf("the origin refused namespace %s's own credentials for %s: %v", r.Namespace, r.Source, err))
		}
		return "", false, a.refuse(req, codes.Unavailable, fmt.Sprintf("checking namespace %s's credentials for %s with the origin: %v", r.Namespace, r.Source, err))
	}
	cacheDir, err := a.opts.ensureCacheDir(r.Root, r.UID)
	if err != nil {
		return "", false, a.refuse(req, codes.FailedPrecondition, err.Error())
	}
	// Handed out under the lock an eviction takes, and counted until the node plugin has
	// mounted it (Mounted): a cache is never evicted between this answer and the mount.
	a.mu.Lock()
	defer a.mu.Unlock()
	if now := j.Snapshot(); now.State != inferencev1.CacheReady {
		return "", true, status.Error(codes.Unavailable, fmt.Sprintf("cache %s stopped being Ready on node %s meanwhile (%s): looking again", req.CacheUID, a.opts.NodeName, now.Reason))
	}
	a.publishing[req.CacheUID]++
	return filepath.Join(cacheDir, prewarmv1alpha1.ModelSubdir), false, nil
}

// FSxToMount opens the FSx directory req names, for the node plugin to mount read-only in a pod
// of req.PodNamespace: a pod without a weights cache reads an FSx model there (its init
// container downloads it into the pod). The directory is opened as the node's own downloads open
// an FSx source (openFSx): only when a sourceAccess rule allows it for the pod's namespace, and
// through real directories only from the file system's mount, never through a link. The node
// plugin mounts the directory as opened, so nothing renamed or linked on the file system after
// the check changes what the pod sees, and no path of the file system is resolved by the
// kubelet on the node (as a hostPath volume would be).
func (a *Agent) FSxToMount(_ context.Context, req MountRequest) (*os.File, error) {
	// The path is the pod's to write, at any length: the answer (and the event) is bounded.
	refuse := func(code codes.Code, err error) error {
		return a.refuse(req, code, text.Clip(err.Error(), text.MaxMessage))
	}
	if req.PodNamespace == "" {
		return nil, refuse(codes.InvalidArgument, errors.New("no pod namespace in the volume context: the CSIDriver must have podInfoOnMount: true"))
	}
	cs := prewarmv1alpha1.CacheSource{Type: inferencev1.ModelSourceFSx, FileSystemID: req.FileSystemID, Path: req.FSxPath}
	if _, err := a.opts.Config.FSxMountPath(cs.FileSystemID); err != nil {
		return nil, refuse(codes.FailedPrecondition, err)
	}
	dir, err := a.opts.openFSx(req.PodNamespace, cs)
	switch {
	case err == nil:
		return dir, nil
	case errors.Is(err, errNotConfined):
		return nil, refuse(codes.PermissionDenied, err)
	case errors.Is(err, source.ErrNotFound):
		return nil, refuse(codes.NotFound, err)
	}
	return nil, refuse(codes.FailedPrecondition, err)
}

// runsCold reports whether a node whose copy of a cache failed for reason serves its pods a
// copy of their own, read from the source: the node cannot hold the cache (no local disk, no
// room even after evicting what the policy lets go, its namespace's per-node limit reached),
// but the source can be read.
func runsCold(reason string) bool {
	switch reason {
	case prewarmv1alpha1.ReasonNoLocalDisk, prewarmv1alpha1.ReasonInsufficientCapacity, prewarmv1alpha1.ReasonBudgetExceeded:
		return true
	}
	return false
}

// fill asks the cache's job to download now and answers why the pod waits.
func (a *Agent) fill(req MountRequest, j *cachejob.Job, st prewarmv1alpha1.CacheStatus) error {
	if st.State == inferencev1.CacheFailed && prewarmv1alpha1.Terminal(st.Reason) {
		return a.refuse(req, codes.FailedPrecondition, fmt.Sprintf("node %s cannot hold cache %s: %s: %s", a.opts.NodeName, req.cache(), st.Reason, st.Message))
	}
	if j.Demand() {
		ctrl.Log.WithName("csi").Info("a pod waits for the cache: downloading it now", "cache", req.CacheUID, "pod", req.PodNamespace+"/"+req.PodName)
	}
	msg := fmt.Sprintf("waiting for node %s to hold cache %s: %s", a.opts.NodeName, req.cache(), progressOf(st))
	a.event(req, corev1.EventTypeNormal, EventCacheFilling, msg)
	return status.Error(codes.Unavailable, msg)
}

func progressOf(st prewarmv1alpha1.CacheStatus) string {
	s := string(st.State)
	if st.Reason != "" {
		s += " (" + st.Reason + ")"
	}
	if st.BytesTotal > 0 && st.State != inferencev1.CacheReady {
		s += fmt.Sprintf(", %d%%: %s of %s", st.BytesDone*100/st.BytesTotal, engine.HumanBytes(st.BytesDone), engine.HumanBytes(st.BytesTotal))
	}
	if st.Message != "" {
		s += "; " + st.Message
	}
	return s
}

// refuse records why a pod's model volume is not mounted, and returns it as a gRPC status.
func (a *Agent) refuse(req MountRequest, code codes.Code, msg string) error {
	typ, reason := corev1.EventTypeWarning, EventCacheRefused
	switch {
	case req.FileSystemID != "":
		reason = EventSourceRefused
	case code == codes.Unavailable || code == codes.NotFound:
		typ, reason = corev1.EventTypeNormal, EventCacheWaiting
	}
	return a.refuseAs(req, code, typ, reason, msg)
}

// refuseAs records why a pod's model volume is not mounted as an event of this type and
// reason, and returns it as a gRPC status.
func (a *Agent) refuseAs(req MountRequest, code codes.Code, typ, reason, msg string) error {
	a.event(req, typ, reason, msg)
	return status.Error(code, msg)
}

// Mounted records that the node plugin is done with the model ModelToMount (or the directory
// FSxToMount) gave req: mounted at target, or not (err).
func (a *Agent) Mounted(req MountRequest, model, target string, err error) {
	if req.FileSystemID != "" {
		if err == nil {
			src := prewarmv1alpha1.CacheSource{Type: inferencev1.ModelSourceFSx, FileSystemID: req.FileSystemID, Path: req.FSxPath}
			a.event(req, corev1.EventTypeNormal, EventSourceMounted, text.Clip(fmt.Sprintf("FSx directory %s mounted read-only from node %s's mount of the file system", src, a.opts.NodeName), text.MaxMessage))
			ctrl.Log.WithName("csi").Info("mounted FSx directory", "source", src.String(), "pod", req.PodNamespace+"/"+req.PodName, "target", target)
		}
		return
	}
	s, cur := a.scratches.state(req.CacheUID)
	scratch := s != nil && cur.ready && model == s.model()
	a.mu.Lock()
	j := a.jobs[req.CacheUID]
	if !scratch && a.publishing[req.CacheUID] > 0 {
		if a.publishing[req.CacheUID]--; a.publishing[req.CacheUID] == 0 {
			delete(a.publishing, req.CacheUID)
		}
	}
	a.mu.Unlock()
	if err != nil {
		return
	}
	msg := fmt.Sprintf("cache %s mounted read-only from node %s's disk", req.cache(), a.opts.NodeName)
	if scratch {
		why := ""
		if j != nil {
			st := j.Snapshot()
			why = fmt.Sprintf(" (%s: %s)", st.Reason, st.Message)
		}
		msg = text.Clip(fmt.Sprintf("cache %s mounted read-only from a copy that node %s downloaded from the source for its pods: running cold, the node cannot hold the cache%s", req.cache(), a.opts.NodeName, why), text.MaxMessage)
	} else if j != nil {
		j.Touch(a.opts.Now())
	}
	a.event(req, corev1.EventTypeNormal, EventCacheMounted, msg)
	ctrl.Log.WithName("csi").Info("mounted cache", "cache", req.CacheUID, "pod", req.PodNamespace+"/"+req.PodName, "target", target)
}

// event records an event on the pod, at most once per EventInterval for the same reason (the
// kubelet retries a mount every few seconds).
func (a *Agent) event(req MountRequest, typ, reason, msg string) {
	if a.recorder == nil || req.PodName == "" || req.PodNamespace == "" {
		return
	}
	msg = text.Clip(msg, text.MaxEventNote)
	key := string(req.PodUID) + "/" + req.CacheUID + "/" + req.CacheName + "/" + reason
	if !a.events.allow(key, a.opts.Now(), a.opts.EventInterval, reason == EventCacheMounted) {
		return
	}
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: req.PodNamespace, Name: req.PodName, UID: req.PodUID},
	}
	action := "Mount"
	if reason == EventCacheDamaged {
		action = "Verify"
	}
	a.recorder.Eventf(pod, nil, typ, reason, action, "%s", msg)
}
