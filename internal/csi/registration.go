package csi

import (
	"context"
	"sync/atomic"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
)

// registration answers the kubelet's plugin watcher, as the node-driver-registrar sidecar
// would: the agent registers itself, so the node plugin needs no second image.
type registration struct {
	registerapi.UnimplementedRegistrationServer
	endpoint   string
	log        logr.Logger
	registered *atomic.Bool
}

func registerRegistration(srv *grpc.Server, o Options, log logr.Logger, registered *atomic.Bool) {
	registerapi.RegisterRegistrationServer(srv, &registration{endpoint: o.Endpoint, log: log, registered: registered})
}

// GetInfo tells the kubelet that this is a CSI plugin, its name and where its socket is.
func (r *registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type: registerapi.CSIPlugin, Name: prewarmv1alpha1.CSIDriverName,
		Endpoint: r.endpoint, SupportedVersions: []string{"1.0.0"},
	}, nil
}

// NotifyRegistrationStatus hears whether the kubelet took the plugin.
func (r *registration) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	r.registered.Store(st.PluginRegistered)
	if st.PluginRegistered {
		r.log.Info("registered with the kubelet")
	} else {
		r.log.Error(nil, "the kubelet refused the plugin", "error", st.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}
