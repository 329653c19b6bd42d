package csi

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/agent"
	"github.com/prewarm/prewarm/internal/testutil"
)

// models is the agent's decision, faked: namespace "team-a" may mount cache "uid-a", which it
// names "llama", and the FSx directory fsx opens.
type models struct {
	dir     string
	fsx     func(agent.MountRequest) (*os.File, error)
	mounted []string
	// told are the requests Mounted was told of.
	told []agent.MountRequest
}

func (m *models) CacheByName(_ context.Context, req agent.MountRequest) (agent.MountRequest, error) {
	if req.PodNamespace != "team-a" || req.CacheName != "llama" {
		return req, status.Errorf(codes.NotFound, "namespace %s has no cache %s", req.PodNamespace, req.CacheName)
	}
	req.CacheUID = "uid-a"
	return req, nil
}

func (m *models) FSxToMount(_ context.Context, req agent.MountRequest) (*os.File, error) {
	if m.fsx == nil {
		return nil, status.Error(codes.NotFound, "no FSx here")
	}
	return m.fsx(req)
}

func (m *models) ModelToMount(_ context.Context, req agent.MountRequest) (string, error) {
	if req.CacheUID != "uid-a" {
		return "", status.Error(codes.NotFound, "no such cache")
	}
	if req.PodNamespace != "team-a" {
		return "", status.Error(codes.PermissionDenied, "not yours")
	}
	return m.dir, nil
}

func (m *models) Mounted(req agent.MountRequest, _, target string, err error) {
	m.told = append(m.told, req)
	if err == nil {
		m.mounted = append(m.mounted, target)
	}
}

// The node plugin over its real socket, with real mounts (root only): a volume is the one model
// directory, read-only, and nothing beside it; a retry of a mounted volume succeeds; targets
// outside the kubelet's pods directory, block volumes and persistent volumes are refused; an
// unpublish unmounts and removes the target, and a second one is fine.
func TestNodePlugin(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	// The agent's image has no mount or umount binary: the plugin must not need one.
	t.Setenv("PATH", "")
	dir := t.TempDir()
	kubelet := filepath.Join(dir, "kubelet")
	cache := filepath.Join(dir, "nvme", "prewarm", "uid-a")
	model := filepath.Join(cache, prewarmv1alpha1.ModelSubdir)
	for path, body := range map[string]string{
		filepath.Join(model, "config.json"):        `{"a":1}`,
		filepath.Join(model, "sub", "w.bin"):       "weights",
		filepath.Join(cache, ".partial", "secret"): "not for the pod",
	} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m := &models{dir: model}
	o := Options{
		NodeName: "node-1", KubeletDir: kubelet, Version: "test", Log: logr.Discard(),
		Endpoint:     filepath.Join(kubelet, "plugins", prewarmv1alpha1.CSIDriverName, "csi.sock"),
		Registration: filepath.Join(kubelet, "plugins_registry", prewarmv1alpha1.CSIDriverName+"-reg.sock"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- New(o, m).Start(sctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	}()
	// The kubelet connects once the plugin's registration socket appears (the last one made).
	for _, sock := range []string{o.Endpoint, o.Registration} {
		if err := testutil.Eventually(ctx, 10*time.Second, func() (bool, error) { _, err := os.Stat(sock); return err == nil, nil }); err != nil {
			t.Fatalf("socket %s: %v", sock, err)
		}
	}
	node := csipb.NewNodeClient(dial(t, o.Endpoint))

	target := filepath.Join(kubelet, "pods", "pod-uid-1", "volumes", "kubernetes.io~csi", "model", "mount")
	t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		t.Fatal(err)
	}
	publish := func(target, ns string, ephemeral bool, capability *csipb.VolumeCapability) error {
		vc := map[string]string{prewarmv1alpha1.VolumeAttributeCacheUID: "uid-a", podNamespaceKey: ns, podNameKey: "pod", podUIDKey: "pod-uid-1"}
		if ephemeral {
			vc[ephemeralKey] = "true"
		}
		_, err := node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{
			VolumeId: "csi-1", TargetPath: target, VolumeCapability: capability, VolumeContext: vc, Readonly: true,
		})
		return err
	}
	fsCap := &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}}}

	// Another namespace: refused, nothing mounted.
	if err := publish(target, "team-b", true, fsCap); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a pod of team-b: %v, want PermissionDenied", err)
	}
	if mounted, _ := isMountPoint(target); mounted {
		t.Fatal("mounted for a refused pod")
	}
	for name, err := range map[string]error{
		"outside the pods directory": publish(filepath.Join(dir, "elsewhere"), "team-a", true, fsCap),
		"a path with ..":             publish(filepath.Join(kubelet, "pods", "..", "x"), "team-a", true, fsCap),
		"a persistent volume":        publish(target, "team-a", false, fsCap),
		"a block volume": publish(target, "team-a", true,
			&csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}}}),
	} {
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}

	if err := publish(target, "team-a", true, fsCap); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(target, "sub", "w.bin")); err != nil || string(b) != "weights" {
		t.Errorf("model file through the volume: %q %v", b, err)
	}
	entries, _ := os.ReadDir(target)
	if len(entries) != 2 {
		t.Errorf("the volume shows %v, want the model's config.json and sub only", entries)
	}
	if _, err := os.Stat(filepath.Join(target, "..", ".partial")); err == nil {
		t.Error("the cache directory beside the model is visible")
	}
	if err := os.WriteFile(filepath.Join(target, "new"), []byte("x"), 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("writing into the volume: %v, want EROFS", err)
	}
	if err := os.Remove(filepath.Join(target, "config.json")); !errors.Is(err, unix.EROFS) {
		t.Errorf("removing from the volume: %v, want EROFS", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); err != nil || st.Flags&unix.ST_NOSUID == 0 || st.Flags&unix.ST_NODEV == 0 {
		t.Errorf("mount flags %#x (%v), want nosuid and nodev", st.Flags, err)
	}
	// The kubelet calls again when an answer is lost: the mount is there, read-only: fine.
	if err := publish(target, "team-a", true, fsCap); err != nil {
		t.Errorf("publishing a mounted volume again: %v", err)
	}
	if len(m.mounted) != 1 {
		t.Errorf("mounted %d times, want once", len(m.mounted))
	}
	// The model directory itself is untouched.
	if b, err := os.ReadFile(filepath.Join(model, "config.json")); err != nil || string(b) != `{"a":1}` {
		t.Errorf("model after the mount: %q %v", b, err)
	}

	for range 2 {
		if _, err := node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: "csi-1", TargetPath: target}); err != nil {
			t.Fatalf("unpublish: %v", err)
		}
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Errorf("target after unpublish: %v, want it gone", err)
	}
	if _, err := os.Stat(filepath.Join(model, "config.json")); err != nil {
		t.Errorf("unpublish touched the model: %v", err)
	}

	// A writable mount at the target is not prewarm's: refused, not taken for a mounted volume.
	if err := os.MkdirAll(target, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dir, target, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if err := publish(target, "team-a", true, fsCap); status.Code(err) != codes.Internal {
		t.Errorf("publishing over a writable mount: %v, want Internal", err)
	}
	if err := unix.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}

	// By name: the agent resolves the name in the pod's namespace (the kubelet's pod info, not
	// the pod's attributes), and the volume is served as by UID; the agent is told of the mount
	// under the cache's UID, so that it counts it against eviction.
	publishAs := func(ns string, attrs map[string]string) error {
		vc := map[string]string{podNamespaceKey: ns, podNameKey: "pod", podUIDKey: "pod-uid-1", ephemeralKey: "true"}
		maps.Copy(vc, attrs)
		_, err := node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{
			VolumeId: "csi-2", TargetPath: target, VolumeCapability: fsCap, VolumeContext: vc, Readonly: true,
		})
		return err
	}
	if err := publishAs("team-a", map[string]string{prewarmv1alpha1.VolumeAttributeCache: "llama", prewarmv1alpha1.VolumeAttributeCacheUID: "uid-a"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a volume naming its cache by name and by UID: %v, want InvalidArgument", err)
	}
	if err := publishAs("team-b", map[string]string{prewarmv1alpha1.VolumeAttributeCache: "llama"}); status.Code(err) != codes.NotFound {
		t.Errorf("a pod of team-b naming llama: %v, want NotFound", err)
	}
	if mounted, _ := isMountPoint(target); mounted {
		t.Fatal("mounted for a pod whose namespace has no cache of the name")
	}
	told := len(m.told)
	if err := publishAs("team-a", map[string]string{prewarmv1alpha1.VolumeAttributeCache: "llama"}); err != nil {
		t.Fatalf("a pod of team-a naming llama: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(target, "sub", "w.bin")); err != nil || string(b) != "weights" {
		t.Errorf("model file through the volume by name: %q %v", b, err)
	}
	if len(m.told) != told+1 || m.told[told].CacheUID != "uid-a" || m.told[told].CacheName != "llama" {
		t.Errorf("the agent was told of %+v, want one mount of uid-a named llama", m.told[told:])
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: "csi-2", TargetPath: target}); err != nil {
		t.Fatalf("unpublish: %v", err)
	}

	// The kubelet's plugin watcher learns the driver's name and socket from the registration
	// socket.
	reg := registerapi.NewRegistrationClient(dial(t, o.Registration))
	info, err := reg.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registerapi.CSIPlugin || info.Name != prewarmv1alpha1.CSIDriverName || info.Endpoint != o.Endpoint {
		t.Errorf("registration info %+v", info)
	}
	id := csipb.NewIdentityClient(dial(t, o.Endpoint))
	if pi, err := id.GetPluginInfo(ctx, &csipb.GetPluginInfoRequest{}); err != nil || pi.Name != prewarmv1alpha1.CSIDriverName {
		t.Errorf("plugin info %+v %v", pi, err)
	}
	if ni, err := node.NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{}); err != nil || ni.NodeId != "node-1" {
		t.Errorf("node info %+v %v", ni, err)
	}
	if fi, err := os.Stat(o.Endpoint); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket %v %v, want mode 0600", fi, err)
	}
}

// A cold pod's FSx volume is the directory the agent opened, not whatever its path leads to by
// the time the plugin mounts it: the file system is its tenants' to write, and a directory
// replaced by a link to the node's files between the agent's check and the mount changes
// nothing. The mount is read-only, nosuid and nodev; a volume naming both a cache and an FSx
// directory is refused.
func TestNodePluginMountsTheFSxDirectoryAsOpened(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	t.Setenv("PATH", "")
	dir := t.TempDir()
	kubelet := filepath.Join(dir, "kubelet")
	model := filepath.Join(dir, "fsx", "shared", "model")
	secret := filepath.Join(dir, "node-secrets")
	for path, body := range map[string]string{filepath.Join(model, "config.json"): `{"a":1}`, filepath.Join(secret, "key"): "secret"} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m := &models{fsx: func(req agent.MountRequest) (*os.File, error) {
		if req.FileSystemID != "fs-1" || req.FSxPath != "shared/model" || req.PodNamespace != "team-a" {
			return nil, status.Error(codes.PermissionDenied, "not yours")
		}
		f, err := os.Open(model)
		if err != nil {
			return nil, err
		}
		// Right after the check: the model's directory goes, and a link to the node's files
		// takes its path.
		if err := os.Rename(model, model+".moved"); err != nil {
			return nil, err
		}
		return f, os.Symlink(secret, model)
	}}
	o := Options{NodeName: "node-1", KubeletDir: kubelet, Version: "test", Log: logr.Discard(),
		Endpoint: filepath.Join(kubelet, "plugins", prewarmv1alpha1.CSIDriverName, "csi.sock")}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- New(o, m).Start(sctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	}()
	if err := testutil.Eventually(ctx, 10*time.Second, func() (bool, error) { _, err := os.Stat(o.Endpoint); return err == nil, nil }); err != nil {
		t.Fatalf("socket: %v", err)
	}
	node := csipb.NewNodeClient(dial(t, o.Endpoint))
	target := filepath.Join(kubelet, "pods", "pod-uid-1", "volumes", "kubernetes.io~csi", "prewarm-fsx", "mount")
	t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		t.Fatal(err)
	}
	publish := func(extra map[string]string) error {
		vc := map[string]string{
			prewarmv1alpha1.VolumeAttributeFSxFileSystemID: "fs-1", prewarmv1alpha1.VolumeAttributeFSxPath: "shared/model",
			podNamespaceKey: "team-a", podNameKey: "pod", podUIDKey: "pod-uid-1", ephemeralKey: "true",
		}
		for k, v := range extra {
			vc[k] = v
		}
		_, err := node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{
			VolumeId: "csi-1", TargetPath: target, VolumeContext: vc, Readonly: true,
			VolumeCapability: &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}}},
		})
		return err
	}
	if err := publish(map[string]string{prewarmv1alpha1.VolumeAttributeCacheUID: "uid-a"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a volume naming a cache and an FSx directory: %v, want InvalidArgument", err)
	}
	if err := publish(map[string]string{podNamespaceKey: "team-b"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a pod the agent refuses: %v, want its refusal", err)
	}
	if mounted, _ := isMountPoint(target); mounted {
		t.Fatal("mounted for a refused volume")
	}
	if err := publish(nil); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(target, "config.json")); err != nil || string(b) != `{"a":1}` {
		t.Errorf("the model through the volume: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(target, "key")); err == nil {
		t.Error("the volume shows the node's files the link led to, not the directory the agent opened")
	}
	if err := os.WriteFile(filepath.Join(target, "new"), []byte("x"), 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("writing into the volume: %v, want EROFS", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); err != nil || st.Flags&unix.ST_NOSUID == 0 || st.Flags&unix.ST_NODEV == 0 {
		t.Errorf("mount flags %#x (%v), want nosuid and nodev", st.Flags, err)
	}
	if len(m.mounted) != 1 {
		t.Errorf("the agent was told of %d mounts, want 1", len(m.mounted))
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: "csi-1", TargetPath: target}); err != nil {
		t.Fatalf("unpublish: %v", err)
	}
	if _, err := os.Stat(filepath.Join(model+".moved", "config.json")); err != nil {
		t.Errorf("unpublish touched the FSx directory: %v", err)
	}
}

func dial(t *testing.T, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// The older kernels' way (a bind mount, then a read-only remount) gives the same mount.
func TestBindRemount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	t.Setenv("PATH", "")
	dir := t.TempDir()
	model, target := filepath.Join(dir, "model"), filepath.Join(dir, "target")
	for _, d := range []string{model, target} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(model, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(model, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := bindRemount(fd, target); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Unmount(target, unix.MNT_DETACH) }()
	if ro, err := readOnly(target); err != nil || !ro {
		t.Errorf("read-only %v %v", ro, err)
	}
	if b, err := os.ReadFile(filepath.Join(target, "f")); err != nil || string(b) != "x" {
		t.Errorf("file through the mount: %q %v", b, err)
	}
	if mounted, err := isMountPoint(target); err != nil || !mounted {
		t.Errorf("mount point %v %v", mounted, err)
	}
	if err := unmount(target); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Errorf("target after unmount: %v", err)
	}
}
