package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/pkg/engine/source"
)

// errNotConfined is matched by the errors of paths that would lead out of where the agent may
// write or read: a symbolic link where prewarm wants a directory, a source that leaves its root.
var errNotConfined = errors.New("not confined")

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

// fileSource resolves an FSx source of namespace ns inside what the sourceAccess rule allowing
// it opens (its directory of the file system's mount): it returns the os.Root of that directory
// and the model's path below it. Links on the way are followed only while they stay inside it,
// so a link under an allowed path never leads to a directory the rule does not allow.
func (o *Options) fileSource(ns string, cs prewarmv1alpha1.CacheSource) (*os.Root, string, error) {
	mount, err := o.Config.FSxMountPath(cs.FileSystemID)
	if err != nil {
		return nil, "", err
	}
	if cs.Path != "" && !filepath.IsLocal(cs.Path) {
		return nil, "", &confineError{fmt.Sprintf("source %s: want a path inside the file system", cs)}
	}
	dir, ok := o.Config.FSxAllowedDir(ns, cs)
	if !ok {
		return nil, "", &confineError{fmt.Sprintf("source %s: no sourceAccess rule lets namespace %s read it", cs, ns)}
	}
	rel, err := filepath.Rel(filepath.FromSlash(dir), filepath.Clean(filepath.FromSlash(cs.Path)))
	if err != nil || !filepath.IsLocal(rel) {
		return nil, "", &confineError{fmt.Sprintf("source %s: not under %q, the directory its rule allows", cs, dir)}
	}
	root, err := o.openAllowedDir(mount, dir, cs)
	if err != nil {
		return nil, "", err
	}
	info, err := root.Stat(rel)
	if err != nil {
		root.Close()
		if errors.Is(err, fs.ErrNotExist) {
			return nil, "", &source.NotFoundError{Err: fmt.Errorf("source %s: %w", cs, err)}
		}
		return nil, "", &confineError{fmt.Sprintf("source %s: %v (a source may not lead out of %s)", cs, err, mount)}
	}
	if !info.IsDir() {
		root.Close()
		return nil, "", fmt.Errorf("source %s is not a directory", cs)
	}
	return root, rel, nil
}

// openAllowedDir opens directory dir (a sourceAccess rule's, "" for all) of the FSx mount,
// looked up inside the mount.
func (o *Options) openAllowedDir(mount, dir string, cs prewarmv1alpha1.CacheSource) (*os.Root, error) {
	root, err := os.OpenRoot(o.local(mount))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("FSx file system %s is not mounted at %s on this node: %w", cs.FileSystemID, mount, err)
		}
		return nil, fmt.Errorf("opening the mount %s of FSx file system %s: %w", mount, cs.FileSystemID, err)
	}
	if dir == "" {
		return root, nil
	}
	defer root.Close()
	sub, err := root.OpenRoot(filepath.FromSlash(dir))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, &source.NotFoundError{Err: fmt.Errorf("source %s: %w", cs, err)}
		}
		return nil, &confineError{fmt.Sprintf("source %s: %v (a source may not lead out of %s)", cs, err, mount)}
	}
	return sub, nil
}
