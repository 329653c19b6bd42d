package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/config"
	"github.com/prewarm/prewarm/internal/testutil"
	"github.com/prewarm/prewarm/internal/testutil/builders"
)

// A pod without a weights cache that reads an FSx model gets the model's directory as prewarm's
// CSI volume, never a hostPath, served by its node's agent (the agent binary, driven over its
// socket as the kubelet drives it): the directory the namespace's sourceAccess rule allows,
// read-only. Once a tenant replaces a directory of the rule's path with a symbolic link, the
// next pod's volume is refused, naming the link, with an event on the pod, and nothing is
// mounted; the pod mounted before keeps the directory it was given.
func TestFSxColdPodEndToEnd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the node plugin mounts: root only")
	}
	const (
		fsID = "fs-0123456789abcdef0"
		node = "fsx-node"
	)
	e := newEnv(t, testutil.ClusterOptions{})
	ctx := e.ctx
	e.fsx = []config.FSxMount{{FileSystemID: fsID, MountPath: "/fsx"}}
	e.configure = func(op *config.OperatorConfiguration) {
		op.SourceAccess = append(op.SourceAccess, config.SourceRule{
			Namespaces: []string{"team-a"}, FSx: &config.FSxRule{FileSystemID: fsID, Path: "projects/team-a"},
		})
	}
	// The file system as the node mounts it (the agent's host prefix is the node's directory).
	fsx := filepath.Join(e.nodes, node, "fsx")
	model := map[string][]byte{"config.json": []byte(`{"fsx":1}`), "w.bin": []byte("weights")}
	for p, data := range model {
		path := filepath.Join(fsx, "projects", "team-a", "llama", p)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e.addNode(node, "ml.g5.24xlarge", s3srv.Endpoint, e.csiArgs(node)...)
	e.startController("--kubeconfig="+e.cluster.KubeconfigPath, "--leader-elect", "--leader-election-namespace=default", "--metrics-bind-address=0", "--health-probe-bind-address=0",
		"--config="+e.config(s3srv.Endpoint), "--agent-image=prewarm/agent:e2e")
	if err := e.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}); err != nil {
		t.Fatal(err)
	}
	iec := builders.MakeInferenceEndpointConfig("team-a", "fsx-model").Obj()
	iec.Spec.ModelSourceConfig = inferencev1.ModelSourceConfig{
		ModelSourceType: inferencev1.ModelSourceFSx, FSxStorage: &inferencev1.FSxStorage{FileSystemID: fsID},
		ModelLocation: "projects/team-a/llama",
	}
	iec.Spec.ModelCacheConfig.WeightsCache.Enabled = false
	iec.Spec.ModelCacheConfig.ImageCache.Enabled = false
	if err := e.c.Create(ctx, iec); err != nil {
		t.Fatal(err)
	}
	dep := &appsv1.Deployment{}
	e.eventually(time.Minute, "the parent's Deployment", func() (bool, string) {
		err := e.c.Get(ctx, types.NamespacedName{Namespace: "team-a", Name: "fsx-model"}, dep)
		return err == nil, fmt.Sprint(err)
	})
	var fsxVolume *corev1.Volume
	for i, v := range dep.Spec.Template.Spec.Volumes {
		if v.HostPath != nil {
			t.Errorf("the pods' volume %s is a hostPath (%s): the kubelet would follow links on the file system", v.Name, v.HostPath.Path)
		}
		if v.CSI != nil && v.CSI.VolumeAttributes[prewarmv1alpha1.VolumeAttributeFSxFileSystemID] == fsID {
			fsxVolume = &dep.Spec.Template.Spec.Volumes[i]
		}
	}
	if fsxVolume == nil {
		t.Fatalf("volumes %+v; want prewarm's CSI volume of the FSx directory", dep.Spec.Template.Spec.Volumes)
	}
	k := e.kubelet(node)
	target := func(p *corev1.Pod) string { return k.k.Target(p, fsxVolume.Name) }
	publish := func(p *corev1.Pod) error {
		t.Cleanup(func() { _ = unix.Unmount(target(p), unix.MNT_DETACH) })
		_, err := k.k.Publish(ctx, p)
		return err
	}

	first := csiPod("team-a", "fsx-cold-1", node, dep)
	if err := e.c.Create(ctx, first); err != nil {
		t.Fatal(err)
	}
	if err := publish(first); err != nil {
		t.Fatalf("the FSx volume of a pod of team-a: %v", err)
	}
	for p, data := range model {
		if got, err := os.ReadFile(filepath.Join(target(first), p)); err != nil || string(got) != string(data) {
			t.Errorf("%s through the volume: %q %v", p, got, err)
		}
	}
	if err := os.WriteFile(filepath.Join(target(first), "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("writing into the volume: %v, want EROFS", err)
	}
	e.waitEvent("team-a", first.Name, "SourceMounted")

	// A tenant who can write the file system's top moves projects/ away and leaves a link in its
	// place: team-a's rule path now passes through a link.
	if err := os.Rename(filepath.Join(fsx, "projects"), filepath.Join(fsx, "elsewhere")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("elsewhere", filepath.Join(fsx, "projects")); err != nil {
		t.Fatal(err)
	}
	second := csiPod("team-a", "fsx-cold-2", node, dep)
	if err := e.c.Create(ctx, second); err != nil {
		t.Fatal(err)
	}
	if err := publish(second); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "projects (/fsx/projects on the node) is a symbolic link") {
		t.Errorf("the FSx volume through a link: %v; want PermissionDenied naming the link", err)
	}
	if entries, _ := os.ReadDir(target(second)); len(entries) != 0 {
		t.Errorf("the refused pod's target shows %v", entries)
	}
	e.waitEvent("team-a", second.Name, "SourceRefused")
	// The first pod keeps the directory it was given.
	if got, err := os.ReadFile(filepath.Join(target(first), "config.json")); err != nil || string(got) != string(model["config.json"]) {
		t.Errorf("the first pod's volume after the link: %q %v", got, err)
	}
	if err := k.k.Unmount(ctx, first, target(first)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(fsx, "elsewhere", "team-a", "llama", "config.json")); err != nil {
		t.Errorf("unpublishing touched the file system: %v", err)
	}
}
