package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/internal/agent/cachejob"
	"github.com/prewarm/prewarm/pkg/engine/source"
)

// errNotConfined is matched by the errors of paths that would lead out of where the agent may
// write or read: a symbolic link where prewarm wants a directory, a source that leaves its root.
var errNotConfined = cachejob.ErrNotConfined

type confineError struct{ msg string }

func (e *confineError) Error() string        { return e.msg }
func (e *confineError) Is(target error) bool { return target == errNotConfined }

// ensureCacheDir makes <root>/prewarm/<uid> (as seen from the agent) a real directory inside the
// allowed root, creating what is missing, and returns its path. An allowed root is the cluster
// admin's and may itself be reached through a link; below it, prewarm's directory and the cache
// directory must be directories, not links: a link there could point anywhere on the node.
// Everything is looked up through an os.Root of the allowed root, so no component can lead out
// of it.
func (o *Options) ensureCacheDir(root, uid string) (string, error) {
	if !uidPattern.MatchString(uid) {
		return "", fmt.Errorf("%q is not a cache UID", uid)
	}
	r, err := os.OpenRoot(o.rootDir(root))
	if errors.Is(err, fs.ErrNotExist) {
		return "", errNoDisk{fmt.Sprintf("the allowed root %s (%s on the node) does not exist on this node: no local disk to keep caches on", root, o.nodePath(root))}
	}
	if err != nil {
		return "", fmt.Errorf("opening the allowed root %s: %w", root, err)
	}
	defer func() { r.Close() }()
	node := o.nodePath(root)
	for _, name := range []string{prewarmv1alpha1.Directory, uid} {
		node = filepath.Join(node, name)
		if err := realDir(r, name, node, true); err != nil {
			return "", err
		}
		sub, err := r.OpenRoot(name)
		if err != nil {
			return "", err
		}
		r.Close()
		r = sub
	}
	return o.cacheDir(root, uid), nil
}

// realDir checks that name, under r, is a directory and not a symbolic link; with create, a
// missing one is made. node is its path on the node, for messages.
func realDir(r *os.Root, name, node string, create bool) error {
	info, err := r.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) && create {
		if err := r.Mkdir(name, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		info, err = r.Lstat(name)
	}
	if err != nil {
		return err
	}
	if info.Mode()&fs.ModeSymlink != 0 {
		target, _ := r.Readlink(name)
		return &confineError{fmt.Sprintf("%s is a symbolic link (to %s); prewarm keeps caches only in real directories under an allowed root", node, target)}
	}
	if !info.IsDir() {
		return &confineError{fmt.Sprintf("%s is not a directory", node)}
	}
	return nil
}

// openCacheParent opens <root>/prewarm for removals and scans; it fails when that is a link.
func (o *Options) openCacheParent(root string) (*os.Root, error) {
	r, err := os.OpenRoot(o.rootDir(root))
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if err := realDir(r, prewarmv1alpha1.Directory, filepath.Join(o.nodePath(root), prewarmv1alpha1.Directory), false); err != nil {
		return nil, err
	}
	return r.OpenRoot(prewarmv1alpha1.Directory)
}

// fileSource opens the directory of an FSx source of namespace ns, for the engine to read: see
// openFSx. It is an os.Root of that directory, so that links inside the model stay inside it.
func (o *Options) fileSource(ns string, cs prewarmv1alpha1.CacheSource) (*os.Root, error) {
	dir, err := o.openFSx(ns, cs)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	// The directory as opened, not its path again: /proc/self/fd/N leads to that directory
	// whatever has been renamed or linked since.
	root, err := os.OpenRoot(fmt.Sprintf("/proc/self/fd/%d", dir.Fd()))
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", cs, err)
	}
	return root, nil
}

// openFSx opens the directory of FSx source cs, which namespace ns reads, when a sourceAccess
// rule allows it: the source's path is under the rule's path, and no component of it, from the
// file system's mount down to the model's directory, is a symbolic link. A rule is matched on
// the path as written and the file system is the tenants' to write, so a link on the way (a
// directory of the rule's path replaced by a link to another team's directory, or to the node's
// root) would lead where the rule does not allow; it fails the cache with a terminal
// InvalidSource that names the link.
func (o *Options) openFSx(ns string, cs prewarmv1alpha1.CacheSource) (*os.File, error) {
	mount, err := o.Config.FSxMountPath(cs.FileSystemID)
	if err != nil {
		return nil, err
	}
	if cs.Path != "" && !filepath.IsLocal(cs.Path) {
		return nil, &confineError{fmt.Sprintf("source %s: want a path inside the file system", cs)}
	}
	dir, ok := o.Config.FSxAllowedDir(ns, cs)
	if !ok {
		return nil, &confineError{fmt.Sprintf("source %s: no sourceAccess rule lets namespace %s read it", cs, ns)}
	}
	rel := filepath.Clean(filepath.FromSlash(cs.Path))
	if under, err := filepath.Rel(filepath.FromSlash(dir), rel); err != nil || !filepath.IsLocal(under) {
		return nil, &confineError{fmt.Sprintf("source %s: not under %q, the directory its rule allows", cs, dir)}
	}
	m, err := os.Open(o.local(mount))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("FSx file system %s is not mounted at %s on this node: %w", cs.FileSystemID, mount, err)
		}
		return nil, fmt.Errorf("opening the mount %s of FSx file system %s: %w", mount, cs.FileSystemID, err)
	}
	if rel == "." {
		return m, nil
	}
	defer m.Close()
	f, err := openBeneath(m, rel)
	var ce *componentError
	if !errors.As(err, &ce) {
		return f, err
	}
	node := filepath.Join(mount, ce.path)
	switch {
	case ce.link != "":
		return nil, &confineError{fmt.Sprintf(
			"source %s: %s (%s on the node) is a symbolic link (to %s); prewarm reads an FSx source only through real directories from the file system's mount, so that no link leads it out of the directory its sourceAccess rule allows: replace the link with the directory, or name the directory it leads to",
			cs, ce.path, node, ce.link)}
	case errors.Is(ce.err, fs.ErrNotExist):
		return nil, &source.NotFoundError{Err: fmt.Errorf("source %s: %s does not exist", cs, node)}
	case errors.Is(ce.err, unix.ENOTDIR):
		return nil, fmt.Errorf("source %s: %s is not a directory", cs, node)
	}
	return nil, fmt.Errorf("source %s: opening %s: %w", cs, node, ce.err)
}
