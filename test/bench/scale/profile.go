package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"k8s.io/client-go/rest"
)

// profileWindow is the length of each CPU profile the API server is asked for: under its
// request timeout (1 min), and short enough that the last one ends soon after the step.
const profileWindow = 10

// profileAPIServer records kube-apiserver's CPU profile (its /debug/pprof/profile, as the admin)
// in back-to-back windows of profileWindow seconds into dir/name-NNN.pprof, until the returned
// stop is called; stop waits for the window in progress (at most profileWindow seconds) and
// returns the files. `go tool pprof` reads them together as one profile. A window that fails is
// logged and ends the recording.
func profileAPIServer(cfg *rest.Config, dir, name string) (stop func() []string) {
	ctx, cancel := context.WithCancel(context.Background())
	var files []string // the goroutine's until done is closed
	done := make(chan struct{})
	go func() {
		defer close(done)
		hc, err := rest.HTTPClientFor(cfg)
		if err != nil {
			log.Printf("profile %s: %v", name, err)
			return
		}
		for i := 0; ctx.Err() == nil; i++ {
			path := filepath.Join(dir, fmt.Sprintf("%s-%03d.pprof", name, i))
			if err := fetchProfile(hc, strings.TrimSuffix(cfg.Host, "/"), path); err != nil {
				log.Printf("profile %s: %v; no more windows of this step", name, err)
				return
			}
			files = append(files, path)
		}
	}()
	return func() []string {
		cancel()
		<-done
		return files
	}
}

// fetchProfile writes one window's profile to path. It is not cancelled with the profiler: a
// window in progress is kept.
func fetchProfile(hc *http.Client, host, path string) error {
	resp, err := hc.Get(fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", host, profileWindow))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s", resp.Status, b)
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, resp.Body); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

// profile starts recording the API server's CPU profile for a step named name when --profile is
// set; the returned function stops it (once; later calls do nothing).
func (f *fleet) profile(name string) func() {
	if f.o.profile == "" {
		return func() {}
	}
	stop := profileAPIServer(f.cluster.Config, f.o.profile, name)
	return sync.OnceFunc(func() {
		files := stop()
		log.Printf("profile %s: %d windows of %d s in %s", name, len(files), profileWindow, f.o.profile)
	})
}
