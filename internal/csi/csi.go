// Package csi is prewarm's CSI node plugin: it serves a pod the one weights cache its model
// volume names, or the one FSx directory a pod without a cache downloads its model from,
// bind-mounted read-only, after the node's agent says the pod may have it. It registers itself
// with the kubelet through the kubelet's plugin registration socket.
//
// Only the node service is offered, for CSI ephemeral volumes: there is nothing to create,
// attach or stage; a volume is a read-only view of a directory the agent has verified.
package csi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/agent"
)

// The volume context keys the kubelet sets with podInfoOnMount (they override the pod's own
// volume attributes of the same name).
const (
	podNamespaceKey = "csi.storage.k8s.io/pod.namespace"
	podNameKey      = "csi.storage.k8s.io/pod.name"
	podUIDKey       = "csi.storage.k8s.io/pod.uid"
	ephemeralKey    = "csi.storage.k8s.io/ephemeral"
)

// Models decides what a volume may mount: the node agent.
type Models interface {
	// CacheByName returns req with the cache it names by name (req.CacheName, in the pod's
	// namespace) as its CacheUID, or a gRPC status error.
	CacheByName(ctx context.Context, req agent.MountRequest) (agent.MountRequest, error)
	// ModelToMount returns the verified model directory req may mount, or a gRPC status error.
	ModelToMount(ctx context.Context, req agent.MountRequest) (string, error)
	// FSxToMount opens the FSx directory req may mount, or returns a gRPC status error. The
	// plugin mounts the directory as opened, and closes it.
	FSxToMount(ctx context.Context, req agent.MountRequest) (*os.File, error)
	// Mounted is told, after every model ModelToMount (or directory FSxToMount) gave, whether
	// the volume was mounted (err nil) or not.
	Mounted(req agent.MountRequest, model, target string, err error)
}

// Options configure the node plugin.
type Options struct {
	// NodeName is the node's name, the plugin's node ID.
	NodeName string
	// Endpoint is the CSI socket's path, as the kubelet and the plugin both see it.
	Endpoint string
	// KubeletDir is the kubelet's root directory (--root-dir): targets must be under its pods/.
	KubeletDir string
	// Registration, when set, is the registration socket the plugin serves for the kubelet's
	// plugin watcher (<kubelet dir>/plugins_registry/<driver>-reg.sock).
	Registration string
	// Version is the plugin's version.
	Version string
	// Log receives what the plugin does.
	Log logr.Logger
}

// Server is the node plugin.
type Server struct {
	csipb.UnimplementedIdentityServer
	csipb.UnimplementedNodeServer
	o      Options
	models Models
	// registered is set once the kubelet has taken the plugin (or when none registers it).
	registered atomic.Bool
}

// New returns a node plugin that asks models what to mount.
func New(o Options, models Models) *Server {
	s := &Server{o: o, models: models}
	s.registered.Store(o.Registration == "")
	return s
}

// Registered is a readiness check: nil once the kubelet has registered the plugin, so that the
// node's pods can have their model volumes.
func (s *Server) Registered(*http.Request) error {
	if !s.registered.Load() {
		return errors.New("the kubelet has not registered the CSI node plugin yet")
	}
	return nil
}

// Start serves the CSI socket, and the registration socket if configured, until ctx ends.
func (s *Server) Start(ctx context.Context) error {
	csiLis, err := listenUnix(s.o.Endpoint)
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	csipb.RegisterIdentityServer(srv, s)
	csipb.RegisterNodeServer(srv, s)
	servers := []*grpc.Server{srv}
	errs := make(chan error, 2)
	go func() { errs <- srv.Serve(csiLis) }()
	if s.o.Registration != "" {
		regLis, err := listenUnix(s.o.Registration)
		if err != nil {
			srv.Stop()
			return err
		}
		reg := grpc.NewServer()
		registerRegistration(reg, s.o, s.o.Log, &s.registered)
		servers = append(servers, reg)
		go func() { errs <- reg.Serve(regLis) }()
	}
	s.o.Log.Info("CSI node plugin serving", "driver", prewarmv1alpha1.CSIDriverName, "endpoint", s.o.Endpoint, "registration", s.o.Registration)
	select {
	case <-ctx.Done():
	case err = <-errs:
	}
	for _, g := range servers {
		g.GracefulStop()
	}
	// The registration socket goes, so the kubelet's plugin watcher sees the plugin leave.
	if s.o.Registration != "" {
		_ = os.Remove(s.o.Registration)
	}
	return err
}

// NeedLeaderElection is false: every node serves its own pods.
func (*Server) NeedLeaderElection() bool { return false }

// listenUnix listens on a Unix socket at path, replacing one left by an earlier run; only root
// may connect.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing the old socket %s: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// GetPluginInfo names the driver.
func (s *Server) GetPluginInfo(context.Context, *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	return &csipb.GetPluginInfoResponse{Name: prewarmv1alpha1.CSIDriverName, VendorVersion: s.o.Version}, nil
}

// GetPluginCapabilities: none; there is no controller service.
func (s *Server) GetPluginCapabilities(context.Context, *csipb.GetPluginCapabilitiesRequest) (*csipb.GetPluginCapabilitiesResponse, error) {
	return &csipb.GetPluginCapabilitiesResponse{}, nil
}

// Probe says the plugin is ready.
func (s *Server) Probe(context.Context, *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	return &csipb.ProbeResponse{}, nil // no ready field: ready
}

// NodeGetCapabilities: none (no staging, no stats).
func (s *Server) NodeGetCapabilities(context.Context, *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	return &csipb.NodeGetCapabilitiesResponse{}, nil
}

// NodeGetInfo gives the node's name as its ID.
func (s *Server) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	return &csipb.NodeGetInfoResponse{NodeId: s.o.NodeName}, nil
}

// NodePublishVolume mounts the model the volume names, read-only, at the target path, once
// the agent has verified it and the pod's namespace may have it.
func (s *Server) NodePublishVolume(ctx context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	target := req.GetTargetPath()
	if err := s.checkTarget(target); err != nil {
		return nil, err
	}
	if c := req.GetVolumeCapability(); c == nil || c.GetMount() == nil {
		return nil, status.Error(codes.InvalidArgument, "prewarm volumes are filesystem mounts (volumeMode Filesystem), not block devices")
	}
	vc := req.GetVolumeContext()
	if vc[ephemeralKey] != "true" {
		return nil, status.Error(codes.InvalidArgument, "prewarm volumes are CSI ephemeral volumes (inline in the pod), not persistent volumes")
	}
	mr := agent.MountRequest{
		CacheUID: vc[prewarmv1alpha1.VolumeAttributeCacheUID], CacheName: vc[prewarmv1alpha1.VolumeAttributeCache],
		FileSystemID: vc[prewarmv1alpha1.VolumeAttributeFSxFileSystemID], FSxPath: vc[prewarmv1alpha1.VolumeAttributeFSxPath],
		PodNamespace: vc[podNamespaceKey], PodName: vc[podNameKey], PodUID: types.UID(vc[podUIDKey]),
	}
	if mr.FileSystemID != "" && (mr.CacheUID != "" || mr.CacheName != "") {
		return nil, status.Errorf(codes.InvalidArgument, "a prewarm volume names a cache (%s or %s) or an FSx file system (%s), not both",
			prewarmv1alpha1.VolumeAttributeCacheUID, prewarmv1alpha1.VolumeAttributeCache, prewarmv1alpha1.VolumeAttributeFSxFileSystemID)
	}
	if mr.CacheUID != "" && mr.CacheName != "" {
		return nil, status.Errorf(codes.InvalidArgument, "a prewarm volume names its cache by UID (%s) or by name (%s), not both",
			prewarmv1alpha1.VolumeAttributeCacheUID, prewarmv1alpha1.VolumeAttributeCache)
	}
	log := s.o.Log.WithValues("cache", mr.CacheUID, "pod", mr.PodNamespace+"/"+mr.PodName, "volume", req.GetVolumeId())
	if mr.CacheName != "" {
		log = log.WithValues("cacheName", mr.CacheName)
	}
	if mr.FileSystemID != "" {
		log = s.o.Log.WithValues("fsx", mr.FileSystemID, "path", mr.FSxPath, "pod", mr.PodNamespace+"/"+mr.PodName, "volume", req.GetVolumeId())
	}
	// Mounted already (a retry after a lost answer): it is read-only, or it is not ours.
	if mounted, err := isMountPoint(target); err != nil {
		return nil, status.Errorf(codes.Internal, "checking the target %s: %v", target, err)
	} else if mounted {
		ro, err := readOnly(target)
		if err != nil || !ro {
			return nil, status.Errorf(codes.Internal, "the target %s is mounted, but not read-only (%v): not prewarm's mount", target, err)
		}
		log.V(1).Info("already mounted")
		return &csipb.NodePublishVolumeResponse{}, nil
	}
	if mr.FileSystemID != "" {
		return s.publishFSx(ctx, mr, target, log)
	}
	if mr.CacheName != "" {
		named, err := s.models.CacheByName(ctx, mr)
		if status.Code(err) == codes.Unavailable {
			log.V(1).Info("not yet", "why", err.Error())
			return nil, err
		} else if err != nil {
			log.Info("refused", "why", err.Error())
			return nil, err
		}
		mr, log = named, log.WithValues("cache", named.CacheUID)
	}
	model, err := s.models.ModelToMount(ctx, mr)
	if err != nil {
		if status.Code(err) == codes.Unavailable {
			log.V(1).Info("not yet", "why", err.Error())
		} else {
			log.Info("refused", "why", err.Error())
		}
		return nil, err
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		s.models.Mounted(mr, model, target, err)
		return nil, status.Errorf(codes.Internal, "making the target %s: %v", target, err)
	}
	if err := bindReadOnly(model, target); err != nil {
		s.models.Mounted(mr, model, target, err)
		return nil, status.Errorf(codes.Internal, "mounting %s at %s: %v", model, target, err)
	}
	s.models.Mounted(mr, model, target, nil)
	return &csipb.NodePublishVolumeResponse{}, nil
}

// publishFSx mounts the FSx directory the volume names, as the agent opened it: the file
// system is its tenants' to write, so the directory is never looked up by its path again (a
// link put there since would be followed).
func (s *Server) publishFSx(ctx context.Context, mr agent.MountRequest, target string, log logr.Logger) (*csipb.NodePublishVolumeResponse, error) {
	dir, err := s.models.FSxToMount(ctx, mr)
	if err != nil {
		log.Info("refused", "why", err.Error())
		return nil, err
	}
	defer dir.Close()
	if err := os.MkdirAll(target, 0o750); err != nil {
		s.models.Mounted(mr, dir.Name(), target, err)
		return nil, status.Errorf(codes.Internal, "making the target %s: %v", target, err)
	}
	if err := bindFDReadOnly(int(dir.Fd()), target); err != nil {
		s.models.Mounted(mr, dir.Name(), target, err)
		return nil, status.Errorf(codes.Internal, "mounting %s at %s: %v", dir.Name(), target, err)
	}
	s.models.Mounted(mr, dir.Name(), target, nil)
	return &csipb.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume unmounts the target and removes it; a target already gone is fine.
func (s *Server) NodeUnpublishVolume(_ context.Context, req *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	target := req.GetTargetPath()
	if err := s.checkTarget(target); err != nil {
		return nil, err
	}
	if err := unmount(target); err != nil {
		return nil, status.Errorf(codes.Internal, "unmounting %s: %v", target, err)
	}
	s.o.Log.Info("unmounted", "volume", req.GetVolumeId(), "target", target)
	return &csipb.NodeUnpublishVolumeResponse{}, nil
}

// checkTarget accepts only a target under the kubelet's pods directory: the plugin mounts
// nothing anywhere else on the node.
func (s *Server) checkTarget(target string) error {
	if target == "" || !filepath.IsAbs(target) {
		return status.Errorf(codes.InvalidArgument, "target path %q: want an absolute path", target)
	}
	pods := filepath.Join(s.o.KubeletDir, "pods") + string(filepath.Separator)
	if clean := filepath.Clean(target); clean != target || !strings.HasPrefix(clean, pods) {
		return status.Errorf(codes.InvalidArgument, "target path %s is not under the kubelet's pods directory %s", target, pods)
	}
	return nil
}
