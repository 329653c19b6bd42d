package agent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/gen"
	"github.com/prewarm/prewarm/internal/testutil/harness"
	"github.com/prewarm/prewarm/pkg/engine"
)

// startAPI starts a real API server (and etcd) for the test, and a context that ends with it.
func startAPI(t *testing.T) (context.Context, *testutil.APIServer) {
	t.Helper()
	ctrl.SetLogger(logr.Discard())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	api := testutil.APIServerFor(t)
	return ctx, api
}

// runAgent runs an agent for node under its own manager until the test ends.
func runAgent(t *testing.T, ctx context.Context, api *testutil.APIServer, node string, o agent.Options) *agent.Agent {
	t.Helper()
	return harness.RunAgent(t, ctx, api, node, o)
}

// askNode makes node's NodeCache asking for reqs, as the controller would.
func askNode(t *testing.T, ctx context.Context, api *testutil.APIServer, node string, reqs ...prewarmv1alpha1.CacheRequest) {
	t.Helper()
	nc := &prewarmv1alpha1.NodeCache{ObjectMeta: metav1.ObjectMeta{Name: node}, Spec: prewarmv1alpha1.NodeCacheSpec{Caches: reqs}}
	if err := api.Client.Create(ctx, nc); err != nil {
		t.Fatal(err)
	}
}

// addRequests adds reqs to node's NodeCache, as the controller would.
func addRequests(t *testing.T, ctx context.Context, api *testutil.APIServer, node string, reqs ...prewarmv1alpha1.CacheRequest) {
	t.Helper()
	nc := &prewarmv1alpha1.NodeCache{}
	if err := api.Client.Get(ctx, client.ObjectKey{Name: node}, nc); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(nc.DeepCopy())
	nc.Spec.Caches = append(nc.Spec.Caches, reqs...)
	if err := api.Client.Patch(ctx, nc, patch); err != nil {
		t.Fatal(err)
	}
}

// watchStatus returns a reader of one cache's status in node's NodeCache, and a wait that fails
// the test with the named caches' statuses when its condition does not hold in time.
func watchStatus(t *testing.T, ctx context.Context, api *testutil.APIServer, node string, uids ...string) (func(string) prewarmv1alpha1.CacheStatus, func(string, func() bool)) {
	status := func(uid string) prewarmv1alpha1.CacheStatus {
		got := &prewarmv1alpha1.NodeCache{}
		if err := api.Client.Get(ctx, client.ObjectKey{Name: node}, got); err != nil {
			t.Fatal(err)
		}
		for _, c := range got.Status.Caches {
			if c.UID == uid {
				return c
			}
		}
		return prewarmv1alpha1.CacheStatus{}
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		if err := testutil.Eventually(ctx, 30*time.Second, func() (bool, error) { return cond(), nil }); err != nil {
			var sts []string
			for _, uid := range uids {
				sts = append(sts, fmt.Sprintf("%+v", status(uid)))
			}
			t.Fatalf("%s: %v; caches %s", what, err, strings.Join(sts, "; "))
		}
	}
	return status, wait
}

func writeFiles(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	for p, data := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Paths are confined: a <root>/prewarm that is a link leads nowhere (nothing is written or
// removed through it); an FSx modelLocation that is, or passes through, a link out of the FSx
// root is refused; a model's own link out of its tree is skipped, the rest cached. And a Ready
// cache whose content changes on disk (one byte flipped, the size unchanged) leaves Ready and
// has only the damaged file fetched again.
func TestAgentConfinesPathsAndReverifiesContent(t *testing.T) {
	ctx, api := startAPI(t)

	const (
		uidLinked  = "66666666-6666-4666-8666-666666666666"
		uidEscape  = "77777777-7777-4777-8777-777777777777"
		uidVia     = "88888888-8888-4888-8888-888888888888"
		uidGood    = "99999999-9999-4999-8999-999999999999"
		uidVictim  = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"
		linkedRoot = "/opt/linked"
		root       = "/opt/dlami/nvme"
	)
	host := t.TempDir()
	secret := map[string][]byte{"secret.key": []byte("host secret")}
	writeFiles(t, filepath.Join(host, "etc", "private"), secret)
	// Something of the host's, named like a cache, that a removal through the link would hit.
	writeFiles(t, filepath.Join(host, "etc", "private", uidVictim), map[string][]byte{"keep": []byte("keep")})
	// Root /opt/linked's prewarm directory is a link to the host's /etc/private.
	for _, r := range []string{linkedRoot, root} {
		if err := os.MkdirAll(filepath.Join(host, r), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(host, "etc", "private"), filepath.Join(host, linkedRoot, "prewarm")); err != nil {
		t.Fatal(err)
	}
	// FSx: a real model with one link out of its tree; a model location that is a link out of
	// the FSx root; one that passes through such a link.
	model := map[string][]byte{"config.json": []byte(`{"a":1}`), "model.safetensors": gen.Bytes(9, 2<<20)}
	writeFiles(t, filepath.Join(host, "fsx", "good"), model)
	if err := os.Symlink(filepath.Join(host, "etc", "private", "secret.key"), filepath.Join(host, "fsx", "good", "leak.key")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(host, "etc", "private"), filepath.Join(host, "fsx", "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(host, "etc"), filepath.Join(host, "fsx", "via")); err != nil {
		t.Fatal(err)
	}

	askNode(t, ctx, api, "node-1",
		prewarmv1alpha1.CacheRequest{UID: uidLinked, Namespace: "a", Name: "linked", Root: linkedRoot, Source: fsxSource("good")},
		prewarmv1alpha1.CacheRequest{UID: uidEscape, Namespace: "b", Name: "escape", Root: root, Source: fsxSource("escape")},
		prewarmv1alpha1.CacheRequest{UID: uidVia, Namespace: "b", Name: "via", Root: root, Source: fsxSource("via/private")},
		prewarmv1alpha1.CacheRequest{UID: uidGood, Namespace: "c", Name: "good", Root: root, Source: fsxSource("good")},
	)
	runAgent(t, ctx, api, "node-1", agent.Options{
		Config: testConfig(root, linkedRoot), HostPrefix: host,
		StatusInterval: 100 * time.Millisecond, RecheckInterval: 200 * time.Millisecond, VerifyInterval: 300 * time.Millisecond,
		RetryInterval: 200 * time.Millisecond, MaxRetryInterval: time.Second,
	})
	status, wait := watchStatus(t, ctx, api, "node-1", uidLinked, uidEscape, uidVia, uidGood)
	wait("all settled", func() bool {
		return status(uidLinked).State == inferencev1.CacheFailed && status(uidEscape).State == inferencev1.CacheFailed &&
			status(uidVia).State == inferencev1.CacheFailed && status(uidGood).State == inferencev1.CacheReady &&
			status(uidGood).LastVerifiedTime != nil
	})
	if st := status(uidLinked); st.Reason != prewarmv1alpha1.ReasonHostPathNotAllowed || !strings.Contains(st.Message, "symbolic link") {
		t.Errorf("a root whose prewarm directory is a link: %+v; want HostPathNotAllowed naming the link", st)
	}
	for _, uid := range []string{uidEscape, uidVia} {
		if st := status(uid); !prewarmv1alpha1.Terminal(st.Reason) || !strings.Contains(st.Message, "fsx://"+testFSx+"/") {
			t.Errorf("a source leading out of the FSx root: %+v; want a terminal failure naming it", st)
		}
	}
	// Nothing written or removed through the link, nothing of the host's in any cache.
	entries, _ := os.ReadDir(filepath.Join(host, "etc", "private"))
	if len(entries) != 2 {
		t.Errorf("the link's target holds %v, want only what the host put there", entries)
	}
	if _, err := os.Stat(filepath.Join(host, "etc", "private", uidVictim, "keep")); err != nil {
		t.Errorf("a host directory named like a cache was removed through the link: %v", err)
	}
	good := prewarmv1alpha1.ModelDir(filepath.Join(host, root), uidGood)
	got, _ := os.ReadDir(good)
	var names []string
	for _, e := range got {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != ".prewarm-manifest.json,config.json,model.safetensors" {
		t.Errorf("the good cache holds %v; want the model without the link out of its tree", names)
	}
	for _, uid := range []string{uidEscape, uidVia} {
		if e, _ := os.ReadDir(prewarmv1alpha1.ModelDir(filepath.Join(host, root), uid)); len(e) != 0 {
			t.Errorf("cache %s holds %v, want nothing", uid, e)
		}
	}

	// One byte flipped in the Ready cache, size unchanged: the periodic content check catches
	// it, the cache leaves Ready, and the file is fetched again.
	shard := filepath.Join(good, "model.safetensors")
	data, _ := os.ReadFile(shard)
	data[12345] ^= 0x01
	if err := os.WriteFile(shard, data, 0o644); err != nil {
		t.Fatal(err)
	}
	config, _ := os.Stat(filepath.Join(good, "config.json"))
	wait("repaired and Ready again", func() bool {
		b, _ := os.ReadFile(shard)
		return string(b) == string(model["model.safetensors"]) && status(uidGood).State == inferencev1.CacheReady
	})
	if after, _ := os.Stat(filepath.Join(good, "config.json")); !os.SameFile(config, after) {
		t.Error("the repair replaced an undamaged file")
	}
}

// A sourceAccess rule that allows a namespace one directory of an FSx file system is held on
// the disk, not only on the path as written. The file system is its tenants' to write, so a
// symbolic link anywhere from the mount down to the model's directory is refused, wherever it
// leads: one under the allowed directory to another team's directory, one that is a directory of
// the rule's own path (to another directory of the file system, or to the node's root), even one
// that stays inside the allowed directory. Each fails the cache with a terminal InvalidSource
// naming the link, while the same namespace's model under real directories is cached. A pod
// without a weights cache gets the same directory, checked the same way, as its FSx volume.
func TestAgentHoldsFSxSourcesToTheirRulesDirectory(t *testing.T) {
	ctx, api := startAPI(t)
	const (
		uidOwn      = "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb"
		uidStolen   = "cccccccc-cccc-4ccc-8ccc-cccccccccccc"
		uidRuleLink = "dddddddd-dddd-4ddd-8ddd-dddddddddddd"
		uidHostRoot = "eeeeeeee-eeee-4eee-8eee-eeeeeeeeeeee"
		uidInside   = "ffffffff-ffff-4fff-8fff-ffffffffffff"
		root        = "/opt/dlami/nvme"
	)
	host := t.TempDir()
	fsx := filepath.Join(host, "fsx")
	model := map[string][]byte{"config.json": []byte(`{"a":1}`), "model.safetensors": gen.Bytes(10, 1<<20)}
	writeFiles(t, filepath.Join(fsx, "team-a", "secret-model"), model)
	writeFiles(t, filepath.Join(fsx, "shared", "open-model"), model)
	writeFiles(t, filepath.Join(fsx, "elsewhere", "team-c", "model"), model)
	writeFiles(t, filepath.Join(host, "team-d", "model"), map[string][]byte{"config.json": []byte(`{"host":1}`)})
	if err := os.MkdirAll(filepath.Join(host, root), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := api.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-c"}}); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		// shared/x -> ../team-a: lexically under shared, on disk team-a's.
		filepath.Join(fsx, "shared", "x"): "../team-a",
		// shared/same -> .: under shared on disk too, but a link all the same.
		filepath.Join(fsx, "shared", "same"): ".",
		// The first directory of team-c's rule path (projects/team-c), which team-c's tenants
		// can write, replaced by a link to another directory of the file system.
		filepath.Join(fsx, "projects"): "elsewhere",
		// The first directory of team-d's rule path replaced by a link to the node's root (here
		// the test's host directory).
		filepath.Join(fsx, "scratch"): host,
	} {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	cfg := testConfig(root)
	cfg.SourceAccess = []config.SourceRule{
		{Namespaces: []string{"team-a"}, FSx: &config.FSxRule{FileSystemID: testFSx, Path: "team-a"}},
		{Namespaces: []string{"team-b"}, FSx: &config.FSxRule{FileSystemID: testFSx, Path: "shared"}},
		{Namespaces: []string{"team-c"}, FSx: &config.FSxRule{FileSystemID: testFSx, Path: "projects/team-c"}},
		{Namespaces: []string{"team-d"}, FSx: &config.FSxRule{FileSystemID: testFSx, Path: "scratch/team-d"}},
	}
	askNode(t, ctx, api, "node-1",
		prewarmv1alpha1.CacheRequest{UID: uidOwn, Namespace: "team-b", Name: "own", Root: root, Source: fsxSource("shared/open-model")},
		prewarmv1alpha1.CacheRequest{UID: uidStolen, Namespace: "team-b", Name: "stolen", Root: root, Source: fsxSource("shared/x/secret-model")},
		prewarmv1alpha1.CacheRequest{UID: uidInside, Namespace: "team-b", Name: "inside", Root: root, Source: fsxSource("shared/same/open-model")},
		prewarmv1alpha1.CacheRequest{UID: uidRuleLink, Namespace: "team-c", Name: "rule-link", Root: root, Source: fsxSource("projects/team-c/model")},
		prewarmv1alpha1.CacheRequest{UID: uidHostRoot, Namespace: "team-d", Name: "host-root", Root: root, Source: fsxSource("scratch/team-d/model")},
	)
	a := runAgent(t, ctx, api, "node-1", agent.Options{
		Config: cfg, HostPrefix: host, EventInterval: time.Hour,
		StatusInterval: 100 * time.Millisecond, RecheckInterval: 200 * time.Millisecond,
		RetryInterval: 200 * time.Millisecond, MaxRetryInterval: time.Second,
	})
	refused := map[string]string{uidStolen: "shared/x", uidInside: "shared/same", uidRuleLink: "projects", uidHostRoot: "scratch"}
	statusOf, wait := watchStatus(t, ctx, api, "node-1", uidOwn, uidStolen, uidInside, uidRuleLink, uidHostRoot)
	wait("all settled", func() bool {
		for uid := range refused {
			if statusOf(uid).State != inferencev1.CacheFailed {
				return false
			}
		}
		return statusOf(uidOwn).State == inferencev1.CacheReady
	})
	for uid, link := range refused {
		st := statusOf(uid)
		if st.Reason != prewarmv1alpha1.ReasonInvalidSource || !prewarmv1alpha1.Terminal(st.Reason) ||
			!strings.Contains(st.Message, link+" (/fsx/"+link+" on the node) is a symbolic link") {
			t.Errorf("a source through the link %s: %+v; want a terminal InvalidSource naming the link", link, st)
		}
		if e, _ := os.ReadDir(prewarmv1alpha1.ModelDir(filepath.Join(host, root), uid)); len(e) != 0 {
			t.Errorf("cache %s holds %v through the link %s; want nothing", uid, e, link)
		}
	}

	// The volume of a pod without a weights cache (its FSx directory): the same directory, held
	// the same way, for the pods of the namespace the rule allows.
	pod := func(ns, path string) agent.MountRequest {
		return agent.MountRequest{FileSystemID: testFSx, FSxPath: path, PodNamespace: ns, PodName: "cold", PodUID: types.UID("uid-" + ns)}
	}
	dir, err := a.FSxToMount(ctx, pod("team-b", "shared/open-model"))
	if err != nil {
		t.Fatalf("the FSx directory of a pod of team-b: %v", err)
	}
	got, _ := dir.Stat()
	dir.Close()
	if want, _ := os.Stat(filepath.Join(fsx, "shared", "open-model")); got == nil || !os.SameFile(got, want) {
		t.Errorf("the FSx directory opened for the pod: %v; want shared/open-model", got)
	}
	for _, x := range []struct {
		req  agent.MountRequest
		code codes.Code
		says string
	}{
		{pod("team-c", "projects/team-c/model"), codes.PermissionDenied, "projects (/fsx/projects on the node) is a symbolic link"},
		{pod("team-d", "scratch/team-d/model"), codes.PermissionDenied, "scratch (/fsx/scratch on the node) is a symbolic link"},
		{pod("team-b", "shared/same/open-model"), codes.PermissionDenied, "shared/same (/fsx/shared/same on the node) is a symbolic link"},
		{pod("team-b", "team-a/secret-model"), codes.PermissionDenied, "no sourceAccess rule lets namespace team-b read it"},
		{pod("team-b", "shared/../team-a/secret-model"), codes.PermissionDenied, `not under "shared", the directory its rule allows`},
		{pod("team-b", "../etc"), codes.PermissionDenied, "want a path inside the file system"},
		{pod("team-b", "shared/missing"), codes.NotFound, "/fsx/shared/missing does not exist"},
		{agent.MountRequest{FileSystemID: "fs-ffffffffffffffff0", FSxPath: "shared", PodNamespace: "team-b", PodName: "cold"}, codes.FailedPrecondition, "fs-ffffffffffffffff0"},
	} {
		if d, err := a.FSxToMount(ctx, x.req); status.Code(err) != x.code || !strings.Contains(err.Error(), x.says) {
			if d != nil {
				d.Close()
			}
			t.Errorf("FSx volume %s of a pod of %s: %v; want %s saying %q", x.req.FSxPath, x.req.PodNamespace, err, x.code, x.says)
		}
	}
	err = testutil.Eventually(ctx, 30*time.Second, func() (bool, error) {
		list := &eventsv1.EventList{}
		if err := api.Client.List(ctx, list, client.InNamespace("team-c")); err != nil {
			return false, err
		}
		return slices.ContainsFunc(list.Items, func(e eventsv1.Event) bool {
			return e.Regarding.Name == "cold" && e.Reason == agent.EventSourceRefused && strings.Contains(e.Note, "is a symbolic link")
		}), nil
	})
	if err != nil {
		t.Errorf("event %s on team-c/cold: %v", agent.EventSourceRefused, err)
	}
}

// A model holding a file named like prewarm's own (its manifest) cannot be cached as it is:
// the node fails it at once with a terminal InvalidSource naming the file, instead of retrying.
func TestAModelNamingPrewarmsOwnFilesFailsForGood(t *testing.T) {
	ctx, api := startAPI(t)
	const (
		uid  = "dddddddd-dddd-4ddd-8ddd-dddddddddddd"
		root = "/opt/dlami/nvme"
	)
	host := t.TempDir()
	writeFiles(t, filepath.Join(host, "fsx", "odd"), map[string][]byte{
		"config.json": []byte(`{"a":1}`), engine.ManifestName: []byte(`{"files":[]}`),
	})
	if err := os.MkdirAll(filepath.Join(host, root), 0o755); err != nil {
		t.Fatal(err)
	}
	askNode(t, ctx, api, "node-1",
		prewarmv1alpha1.CacheRequest{UID: uid, Namespace: "a", Name: "odd", Root: root, Source: fsxSource("odd")},
	)
	runAgent(t, ctx, api, "node-1", agent.Options{
		Config: testConfig(root), HostPrefix: host,
		StatusInterval: 100 * time.Millisecond, RetryInterval: 200 * time.Millisecond, MaxRetryInterval: time.Second,
	})
	status, wait := watchStatus(t, ctx, api, "node-1", uid)
	wait("failed", func() bool { return status(uid).State == inferencev1.CacheFailed })
	st := status(uid)
	if st.Reason != prewarmv1alpha1.ReasonInvalidSource || !prewarmv1alpha1.Terminal(st.Reason) || !strings.Contains(st.Message, engine.ManifestName) {
		t.Errorf("a model naming prewarm's manifest: %+v; want a terminal InvalidSource naming the file", st)
	}
}
