// Package hubfixture is a Hugging Face Hub–compatible HTTP server for tests: the subset of the
// Hub API that prewarm's client uses (model info at a revision, the recursive file tree with
// pagination and LFS sha256, resolve with Range and a redirect to a separate content host,
// 401/403 for gated repositories with X-Error-Code). No Kubernetes imports.
package hubfixture

import (
	"bytes"
	"crypto/sha1" //nolint:gosec // git blob ids are SHA-1
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// LFSThreshold: files at least this large are stored as LFS (redirected, with a sha256).
const LFSThreshold = 1 << 20

// Repo is one model repository.
type Repo struct {
	// Branches map a name (e.g. "main") to a commit.
	Branches map[string]string
	// Commits map a commit sha to its files.
	Commits map[string]map[string][]byte
	// Gated repositories need a token; Granted lists the tokens whose owners were let in.
	Gated   bool
	Granted map[string]bool
}

// Hub is the fixture server.
type Hub struct {
	// URL is the Hub endpoint (HF_ENDPOINT).
	URL string
	// CDNURL is the content host LFS downloads are redirected to.
	CDNURL string
	// Served counts body bytes of file downloads (resolve and the content host).
	Served atomic.Int64
	// PageSize is how many tree entries one page holds (small, to exercise pagination).
	PageSize int
	// TreePages counts the pages of file trees served.
	TreePages atomic.Int64

	mu    sync.Mutex
	repos map[string]*Repo
	blobs map[string][]byte // sha256 -> content, on the content host
	hub   *httptest.Server
	cdn   *httptest.Server
}

// Start runs the hub and its content host on loopback.
func Start() *Hub {
	h, err := StartOn("127.0.0.1")
	if err != nil {
		panic(err)
	}
	return h
}

// StartOn runs the hub and its content host on host (an IP address of this machine), for
// clients in pods.
func StartOn(host string) (*Hub, error) {
	h := &Hub{repos: map[string]*Repo{}, blobs: map[string][]byte{}, PageSize: 3}
	serve := func(f http.HandlerFunc) (*httptest.Server, error) {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, err
		}
		s := httptest.NewUnstartedServer(f)
		s.Listener.Close()
		s.Listener = l
		s.Start()
		return s, nil
	}
	var err error
	if h.cdn, err = serve(h.serveCDN); err != nil {
		return nil, err
	}
	if h.hub, err = serve(h.serveHub); err != nil {
		h.cdn.Close()
		return nil, err
	}
	h.URL, h.CDNURL = h.hub.URL, h.cdn.URL
	return h, nil
}

// Close stops both servers.
func (h *Hub) Close() { h.hub.Close(); h.cdn.Close() }

// AddCommit adds a commit with these files to a repository (created if new) and points the
// branch at it. It returns the commit sha.
func (h *Hub) AddCommit(repoID, branch string, files map[string][]byte) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.repos[repoID]
	if r == nil {
		r = &Repo{Branches: map[string]string{}, Commits: map[string]map[string][]byte{}, Granted: map[string]bool{}}
		h.repos[repoID] = r
	}
	hash := sha1.New() //nolint:gosec // commit ids
	fmt.Fprintf(hash, "%s %d", repoID, len(r.Commits))
	names := make([]string, 0, len(files))
	for p := range files {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		fmt.Fprintf(hash, "%s %x\n", p, sha256.Sum256(files[p]))
		if len(files[p]) >= LFSThreshold {
			sum := sha256.Sum256(files[p])
			h.blobs[hex.EncodeToString(sum[:])] = files[p]
		}
	}
	sha := hex.EncodeToString(hash.Sum(nil))
	r.Commits[sha] = files
	r.Branches[branch] = sha
	return sha
}

// SetGated makes a repository gated, letting in the owners of these tokens.
func (h *Hub) SetGated(repoID string, granted ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.repos[repoID]
	r.Gated = true
	for _, t := range granted {
		r.Granted[t] = true
	}
}

// Corrupt changes one byte of an LFS file as served, without changing its listed sha256.
func (h *Hub) Corrupt(content []byte, offset int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	sum := sha256.Sum256(content)
	b := bytes.Clone(h.blobs[hex.EncodeToString(sum[:])])
	b[offset] ^= 0xff
	h.blobs[hex.EncodeToString(sum[:])] = b
}

func hubError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("X-Error-Code", code)
	w.Header().Set("X-Error-Message", msg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// lookup resolves repo and revision, enforcing gating. ok=false means an error was written.
func (h *Hub) lookup(w http.ResponseWriter, r *http.Request, repoID, rev string) (string, map[string][]byte, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	repo := h.repos[repoID]
	if repo == nil {
		hubError(w, http.StatusNotFound, "RepoNotFound", "Repository Not Found for url: "+r.URL.String())
		return "", nil, false
	}
	if repo.Gated {
		token := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		if token == "" {
			hubError(w, http.StatusUnauthorized, "GatedRepo", "Access to model "+repoID+" is restricted. You must have access to it and be authenticated to access it. Please log in.")
			return "", nil, false
		}
		if !repo.Granted[token] {
			hubError(w, http.StatusForbidden, "GatedRepo", "Access to model "+repoID+" is restricted and you are not in the authorized list.")
			return "", nil, false
		}
	}
	sha := rev
	if b, ok := repo.Branches[rev]; ok {
		sha = b
	}
	files, ok := repo.Commits[sha]
	if !ok {
		hubError(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id: "+rev)
		return "", nil, false
	}
	return sha, files, true
}

// serveHub routes /api/models/{org}/{name}/revision/{rev}, /api/models/{org}/{name}/tree/{rev}
// and /{org}/{name}/resolve/{rev}/{path}.
func (h *Hub) serveHub(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")
	switch {
	case len(parts) >= 6 && parts[0] == "api" && parts[1] == "models" && parts[4] == "revision":
		repoID := parts[2] + "/" + parts[3]
		rev, _ := url.PathUnescape(strings.Join(parts[5:], "/"))
		sha, files, ok := h.lookup(w, r, repoID, rev)
		if !ok {
			return
		}
		var siblings []map[string]string
		for p := range files {
			siblings = append(siblings, map[string]string{"rfilename": p})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"id": repoID, "sha": sha, "siblings": siblings})
	case len(parts) >= 6 && parts[0] == "api" && parts[1] == "models" && parts[4] == "tree":
		h.serveTree(w, r, parts[2]+"/"+parts[3], parts[5])
	case len(parts) >= 5 && parts[2] == "resolve":
		h.serveResolve(w, r, parts[0]+"/"+parts[1], parts[3], strings.Join(parts[4:], "/"))
	default:
		http.NotFound(w, r)
	}
}

type treeEntry struct {
	Type string    `json:"type"`
	Path string    `json:"path"`
	Size int64     `json:"size,omitempty"`
	OID  string    `json:"oid"`
	LFS  *lfsEntry `json:"lfs,omitempty"`
}

type lfsEntry struct {
	OID         string `json:"oid"`
	Size        int64  `json:"size"`
	PointerSize int    `json:"pointerSize"`
}

// GitBlobID returns the git blob id of content: sha1("blob <size>\0" + content).
func GitBlobID(content []byte) string {
	h := sha1.New() //nolint:gosec // git blob ids are SHA-1
	fmt.Fprintf(h, "blob %d\x00", len(content))
	h.Write(content)
	return hex.EncodeToString(h.Sum(nil))
}

func (h *Hub) serveTree(w http.ResponseWriter, r *http.Request, repoID, rev string) {
	_, files, ok := h.lookup(w, r, repoID, rev)
	if !ok {
		return
	}
	if r.URL.Query().Get("recursive") != "true" && r.URL.Query().Get("recursive") != "1" {
		hubError(w, http.StatusBadRequest, "BadRequest", "this fixture serves recursive listings only")
		return
	}
	var entries []treeEntry
	dirs := map[string]bool{}
	for p, data := range files {
		for d := p; strings.Contains(d, "/"); {
			d = d[:strings.LastIndex(d, "/")]
			if !dirs[d] {
				dirs[d] = true
				entries = append(entries, treeEntry{Type: "directory", Path: d, OID: GitBlobID([]byte(d))})
			}
		}
		e := treeEntry{Type: "file", Path: p, Size: int64(len(data)), OID: GitBlobID(data)}
		if len(data) >= LFSThreshold {
			sum := sha256.Sum256(data)
			e.LFS = &lfsEntry{OID: hex.EncodeToString(sum[:]), Size: int64(len(data)), PointerSize: 134}
		}
		entries = append(entries, e)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Path < entries[j].Path })
	h.TreePages.Add(1)
	start, _ := strconv.Atoi(r.URL.Query().Get("cursor"))
	end := min(len(entries), start+h.PageSize)
	if end < len(entries) {
		next := *r.URL
		q := next.Query()
		q.Set("cursor", strconv.Itoa(end))
		next.RawQuery = q.Encode()
		w.Header().Set("Link", fmt.Sprintf(`<%s%s>; rel="next"`, h.URL, next.RequestURI()))
	}
	_ = json.NewEncoder(w).Encode(entries[start:end])
}

func (h *Hub) serveResolve(w http.ResponseWriter, r *http.Request, repoID, rev, escaped string) {
	p, err := url.PathUnescape(escaped)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	sha, files, ok := h.lookup(w, r, repoID, rev)
	if !ok {
		return
	}
	data, ok := files[p]
	if !ok {
		hubError(w, http.StatusNotFound, "EntryNotFound", p+" does not exist on "+rev)
		return
	}
	w.Header().Set("X-Repo-Commit", sha)
	if len(data) >= LFSThreshold {
		sum := sha256.Sum256(data)
		oid := hex.EncodeToString(sum[:])
		w.Header().Set("X-Linked-Size", strconv.Itoa(len(data)))
		w.Header().Set("X-Linked-Etag", `"`+oid+`"`)
		http.Redirect(w, r, h.CDNURL+"/repos/"+oid+"?expires=soon", http.StatusFound)
		return
	}
	w.Header().Set("ETag", `"`+GitBlobID(data)+`"`)
	http.ServeContent(&countingWriter{w, &h.Served}, r, "", time.Time{}, bytes.NewReader(data))
}

func (h *Hub) serveCDN(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "" {
		http.Error(w, "the content host must not receive the Hub token", http.StatusBadRequest)
		return
	}
	oid := strings.TrimPrefix(r.URL.Path, "/repos/")
	h.mu.Lock()
	data, ok := h.blobs[oid]
	h.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return
	}
	http.ServeContent(&countingWriter{w, &h.Served}, r, "", time.Time{}, bytes.NewReader(data))
}

type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	c.n.Add(int64(n))
	return n, err
}
