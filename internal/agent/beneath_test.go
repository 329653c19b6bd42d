package agent

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// A directory is opened below another only through real directories: a symbolic link in any
// component (whether it leads out, elsewhere inside, or to the component's own directory), a
// "..", or a file stops the walk, which names the component. Both ways give the same answers:
// openat2, and the walk one component at a time that kernels without it use.
func TestOpenBeneathRefusesLinks(t *testing.T) {
	top := t.TempDir()
	outside := t.TempDir()
	for _, d := range []string{"a/b/c", "other/c", "file-parent"} {
		if err := os.MkdirAll(filepath.Join(top, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(top, "a", "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		"up":       outside, // absolute, out of the tree
		"a/rel":    "../other",
		"a/self":   ".",
		"a/b/back": "../b",
		"dangling": "nowhere",
	} {
		if err := os.Symlink(target, filepath.Join(top, link)); err != nil {
			t.Fatal(err)
		}
	}
	parent, err := os.Open(top)
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	// Where the kernel has openat2, openBeneath's one call answers (the walk is then only for
	// naming what it refused).
	if fd, err := unix.Openat2(int(parent.Fd()), "a/b/c", beneath()); errors.Is(err, unix.ENOSYS) {
		t.Log("this kernel has no openat2: both ways are the walk")
	} else if err != nil {
		t.Errorf("openat2 of a real directory: %v", err)
	} else {
		unix.Close(fd)
		if fd, err := unix.Openat2(int(parent.Fd()), "a/self/b", beneath()); !errors.Is(err, unix.ELOOP) {
			if err == nil {
				unix.Close(fd)
			}
			t.Errorf("openat2 through a link: %v, want ELOOP", err)
		}
	}
	for name, open := range map[string]func(*os.File, string) (*os.File, error){"openat2": openBeneath, "each component": openEach} {
		t.Run(name, func(t *testing.T) {
			for _, rel := range []string{"a", "a/b/c", "other/c", "a/./b"} {
				f, err := open(parent, rel)
				if err != nil {
					t.Errorf("%s: %v", rel, err)
					continue
				}
				got, _ := f.Stat()
				f.Close()
				if want, _ := os.Stat(filepath.Join(top, rel)); got == nil || !os.SameFile(got, want) {
					t.Errorf("%s opened %v, want the directory itself", rel, got)
				}
			}
			for _, x := range []struct{ rel, at, link string }{
				{"up", "up", outside},
				{"up/x", "up", outside},
				{"a/rel/c", "a/rel", "../other"},
				{"a/self/b", "a/self", "."},
				{"a/self", "a/self", "."},
				{"a/b/back/c", "a/b/back", "../b"},
				{"dangling", "dangling", "nowhere"},
			} {
				f, err := open(parent, x.rel)
				var ce *componentError
				if !errors.As(err, &ce) || ce.path != x.at || ce.link != x.link {
					if f != nil {
						f.Close()
					}
					t.Errorf("%s: %v (%+v); want the link %s (to %s) named", x.rel, err, ce, x.at, x.link)
				}
			}
			for _, x := range []struct {
				rel, at string
				err     error
			}{
				{"a/f", "a/f", unix.ENOTDIR},
				{"a/f/g", "a/f", unix.ENOTDIR},
				{"a/missing/c", "a/missing", os.ErrNotExist},
			} {
				f, err := open(parent, x.rel)
				var ce *componentError
				if !errors.As(err, &ce) || ce.path != x.at || ce.link != "" || !errors.Is(err, x.err) {
					if f != nil {
						f.Close()
					}
					t.Errorf("%s: %v; want %v at %s", x.rel, err, x.err, x.at)
				}
			}
			if f, err := open(parent, "a/../../"+filepath.Base(outside)); err == nil {
				f.Close()
				t.Errorf("a path with .. out of the tree was opened")
			}
		})
	}
}
