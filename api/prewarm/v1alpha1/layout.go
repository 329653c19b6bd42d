package v1alpha1

import "path/filepath"

// The on-disk layout of weights caches on a node, shared by the controller (which mounts a
// cache into pods), the agent (which fills it) and the pods' init container (which reads it):
//
//	<root>/prewarm/                   Directory: prewarm's directory under an allowed root
//	<root>/prewarm/<uid>/             CacheDir: one cache, the only directory a pod mounts
//	<root>/prewarm/<uid>/model/       ModelDir: the verified model, published by one rename
//	<root>/prewarm/<uid>/.model.prewarm-partial/   the download in progress
//
// The cache directory itself is never renamed or replaced while the cache is wanted, so a pod's
// mount of it stays valid across re-downloads and repairs of the model inside it.
const (
	// Directory is the name of the directory under each allowed root that holds prewarm's caches.
	Directory = "prewarm"
	// ModelSubdir is the name, inside a cache directory, of the published model.
	ModelSubdir = "model"
)

// CacheDir is where cache uid lives under root.
func CacheDir(root, uid string) string { return filepath.Join(root, Directory, uid) }

// ModelDir is where cache uid's published model lives under root.
func ModelDir(root, uid string) string { return filepath.Join(root, Directory, uid, ModelSubdir) }
