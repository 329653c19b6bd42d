package realnode

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// cri is a connection to the node's containerd through the CRI, as the kubelet and crictl talk
// to it.
type cri struct {
	conn    *grpc.ClientConn
	runtime runtimeapi.RuntimeServiceClient
	images  runtimeapi.ImageServiceClient
}

func (n *Node) cri() (*cri, error) {
	conn, err := grpc.NewClient("unix://"+n.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &cri{conn: conn, runtime: runtimeapi.NewRuntimeServiceClient(conn), images: runtimeapi.NewImageServiceClient(conn)}, nil
}

// Image is an image the node's runtime holds.
type Image struct {
	ID   string
	Tags []string
	Size uint64
	// Pinned images are never garbage collected (the sandbox image).
	Pinned bool
}

// Images lists the images the node holds.
func (n *Node) Images(ctx context.Context) ([]Image, error) {
	c, err := n.cri()
	if err != nil {
		return nil, err
	}
	defer c.conn.Close()
	resp, err := c.images.ListImages(ctx, &runtimeapi.ListImagesRequest{})
	if err != nil {
		return nil, err
	}
	var out []Image
	for _, im := range resp.Images {
		out = append(out, Image{ID: im.Id, Tags: im.RepoTags, Size: im.Size, Pinned: im.Pinned})
	}
	return out, nil
}

// HasImage reports whether the node holds an image tagged ref (e.g. docker.io/vllm/vllm-openai:latest).
func (n *Node) HasImage(ctx context.Context, ref string) (bool, error) {
	ims, err := n.Images(ctx)
	if err != nil {
		return false, err
	}
	for _, im := range ims {
		if slices.Contains(im.Tags, ref) {
			return true, nil
		}
	}
	return false, nil
}

// PruneImages removes every image no container uses, as `crictl rmi --prune` does and as the
// kubelet's image garbage collection does under disk pressure (pinned images excepted, as the
// kubelet excepts them). It returns the tags of the images it removed.
func (n *Node) PruneImages(ctx context.Context) ([]string, error) {
	c, err := n.cri()
	if err != nil {
		return nil, err
	}
	defer c.conn.Close()
	ctrs, err := c.runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return nil, err
	}
	used := map[string]bool{}
	for _, ctr := range ctrs.Containers {
		used[ctr.ImageRef] = true
		if ctr.Image != nil {
			used[ctr.Image.Image] = true
		}
	}
	imgs, err := c.images.ListImages(ctx, &runtimeapi.ListImagesRequest{})
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, im := range imgs.Images {
		if used[im.Id] || im.Pinned {
			continue
		}
		if _, err := c.images.RemoveImage(ctx, &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: im.Id}}); err != nil {
			errs = append(errs, fmt.Errorf("removing %v: %w", im.RepoTags, err))
			continue
		}
		removed = append(removed, im.RepoTags...)
	}
	return removed, errors.Join(errs...)
}

// removePods stops and removes every pod sandbox on the node (its containers with it, its
// network released through the CNI).
func (n *Node) removePods(ctx context.Context) error {
	c, err := n.cri()
	if err != nil {
		return err
	}
	defer c.conn.Close()
	resp, err := c.runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return err
	}
	var errs []error
	for _, sb := range resp.Items {
		if _, err := c.runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, err)
		}
		if _, err := c.runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
