// Command sleeper keeps an image cache's container alive, and so its image pinned on the node,
// doing nothing until it is told to stop. It is static and has no dependencies, so it runs in any
// image, with or without a shell. "sleeper --install PATH" copies the binary to PATH (the image
// cache pod's init container does this into a volume the target image's container runs it from).
package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "--install" {
		if err := install(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "sleeper:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: sleeper [--install PATH]")
		os.Exit(2)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}

// install copies the running binary to path, executable, via a temporary name.
func install(path string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	in, err := os.Open(self)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := path + ".tmp"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
