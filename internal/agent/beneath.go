package agent

import (
	"errors"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// componentError says which component of a path could not be opened as a real directory.
type componentError struct {
	// path is the path up to and including the component, relative to where the walk began.
	path string
	// link is where the component leads, when it is a symbolic link.
	link string
	err  error
}

func (e *componentError) Error() string {
	if e.link != "" {
		return e.path + " is a symbolic link (to " + e.link + ")"
	}
	return e.path + ": " + e.err.Error()
}

func (e *componentError) Unwrap() error { return e.err }

// openBeneath opens the directory rel below the directory parent without following a symbolic
// link in any component of rel, nor leaving parent. openat2 (RESOLVE_NO_SYMLINKS and
// RESOLVE_BENEATH) does it in one call. Where it refuses, or where the kernel has no openat2
// (before 5.6, or a seccomp profile that does not know it), each component is opened in turn
// with O_NOFOLLOW|O_DIRECTORY: as strict, and it names the component at fault
// (*componentError).
func openBeneath(parent *os.File, rel string) (*os.File, error) {
	fd, err := unix.Openat2(int(parent.Fd()), rel, beneath())
	if err == nil {
		return os.NewFile(uintptr(fd), filepath.Join(parent.Name(), rel)), nil
	}
	return openEach(parent, rel)
}

// beneath is how openBeneath asks openat2.
func beneath() *unix.OpenHow {
	return &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_BENEATH,
	}
}

// openEach is openBeneath one component at a time: each is opened with O_NOFOLLOW|O_DIRECTORY
// from the one before, so a link, a ".." or a file anywhere on the way stops it.
func openEach(parent *os.File, rel string) (*os.File, error) {
	fd, own, done := int(parent.Fd()), false, ""
	release := func() {
		if own {
			unix.Close(fd)
		}
	}
	for _, name := range strings.Split(filepath.ToSlash(rel), "/") {
		if name == "" || name == "." {
			continue
		}
		at := path.Join(done, name)
		if name == ".." {
			release()
			return nil, &componentError{path: at, err: errors.New("a path that leads up out of where it starts")}
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			ce := &componentError{path: at, err: err}
			// A link refused by O_NOFOLLOW is ELOOP, or ENOTDIR where O_DIRECTORY is checked first.
			var st unix.Stat_t
			if (errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR)) &&
				unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				ce.link = readlinkat(fd, name)
			}
			release()
			return nil, ce
		}
		release()
		fd, own, done = next, true, at
	}
	if !own {
		// Nothing to walk: the parent itself, opened again.
		var err error
		if fd, err = unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return nil, &componentError{path: ".", err: err}
		}
	}
	return os.NewFile(uintptr(fd), filepath.Join(parent.Name(), rel)), nil
}

// readlinkat returns where link name (under directory fd) leads, or "?" if it cannot be read.
func readlinkat(fd int, name string) string {
	buf := make([]byte, 4096)
	n, err := unix.Readlinkat(fd, name, buf)
	if err != nil {
		return "?"
	}
	return string(buf[:n])
}
