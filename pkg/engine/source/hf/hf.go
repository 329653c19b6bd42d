// Package hf reads a model from the Hugging Face Hub, or a mirror of it, over the Hub's HTTP API.
package hf

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"github.com/prewarm/prewarm/pkg/engine/source"
)

// DefaultEndpoint is the public Hub.
const DefaultEndpoint = "https://huggingface.co"

// Options say which repository, at which revision, and how to reach it.
type Options struct {
	// RepoID is org/name.
	RepoID string
	// Revision is a branch, tag or commit; default "main". A branch or tag is resolved once,
	// in List, to a commit, and every read uses that commit.
	Revision string
	// Endpoint is the Hub or a mirror; default https://huggingface.co. (The environment is the
	// caller's to read: kubectl-prewarm pull takes $HF_ENDPOINT, the agents the configuration.)
	Endpoint string
	// Token is sent as a bearer token, for gated and private repositories. It never appears in
	// errors or String.
	Token string
	// HTTPClient replaces http.DefaultClient.
	HTTPClient *http.Client
	// MaxFiles is the most files List returns; a repository with more fails the listing with a
	// *source.TooManyFilesError at the page that passes the bound. Default
	// source.DefaultMaxFiles.
	MaxFiles int
}

// MaxAnswerBytes bounds one answer of the Hub's API that List reads (the revision's
// information, one page of the file tree): the Hub's pages hold at most a thousand entries, a
// few hundred kilobytes.
const MaxAnswerBytes = 32 << 20

// Source is one repository at one revision.
type Source struct {
	opts   Options
	client *http.Client
	commit string // set by List
}

var repoIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$`)

var commitPattern = regexp.MustCompile(`^[0-9a-f]{40}$`)

// New returns a source for opts.
func New(opts Options) (*Source, error) {
	if !repoIDPattern.MatchString(opts.RepoID) || strings.Contains(opts.RepoID, "..") {
		return nil, fmt.Errorf("hf: repository %q is not org/name", opts.RepoID)
	}
	if opts.Revision == "" {
		opts.Revision = "main"
	}
	if opts.Endpoint == "" {
		opts.Endpoint = DefaultEndpoint
	}
	opts.Endpoint = strings.TrimSuffix(opts.Endpoint, "/")
	c := opts.HTTPClient
	if c == nil {
		c = &http.Client{Transport: &http.Transport{
			Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 128, DisableCompression: true, ReadBufferSize: 256 << 10,
		}}
	}
	// The token goes to the Hub only: a redirect to another host or port (the LFS content host)
	// drops it. net/http keeps it when only the port differs.
	withPolicy := *c
	withPolicy.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		if req.URL.Host != via[0].URL.Host {
			req.Header.Del("Authorization")
		}
		return nil
	}
	opts.MaxFiles = source.MaxFiles(opts.MaxFiles)
	s := &Source{opts: opts, client: &withPolicy}
	if commitPattern.MatchString(opts.Revision) {
		s.commit = opts.Revision
	}
	return s, nil
}

func (s *Source) String() string {
	rev := s.opts.Revision
	if s.commit != "" {
		rev = s.commit
	}
	return "hf://" + s.opts.RepoID + "@" + rev
}

func (s *Source) get(ctx context.Context, method, rawURL string, hdr http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, rawURL, nil)
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if s.opts.Token != "" {
		req.Header.Set("Authorization", "Bearer "+s.opts.Token)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, s.statusError(resp)
	}
	return resp, nil
}

// statusError turns a Hub error answer into the engine's classes, with a hint for people.
func (s *Source) statusError(resp *http.Response) error {
	code := resp.Header.Get("X-Error-Code")
	msg := resp.Header.Get("X-Error-Message")
	if msg == "" {
		msg = resp.Status
	}
	base := &source.StatusError{StatusCode: resp.StatusCode, Code: code, Message: s.opts.RepoID + ": " + msg, RetryAfter: resp.Header.Get("Retry-After")}
	switch {
	case code == "GatedRepo" && s.opts.Token == "":
		return &source.AccessError{Gated: true, Err: base, Hint: "the repository is gated: accept its terms on the Hub, then pass a token that has access"}
	case code == "GatedRepo":
		return &source.AccessError{Gated: true, Err: base, Hint: "the token's owner has not been granted access to this gated repository: accept its terms on the Hub with that account"}
	case resp.StatusCode == http.StatusUnauthorized && s.opts.Token == "":
		return &source.AccessError{Err: base, Hint: "the repository is private or does not exist: pass a token that can read it"}
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return &source.AccessError{Err: base, Hint: "the token cannot read this repository"}
	case resp.StatusCode == http.StatusNotFound:
		return &source.NotFoundError{Err: base}
	}
	return base
}

type revisionInfo struct {
	SHA string `json:"sha"`
}

type treeEntry struct {
	Type string `json:"type"`
	Path string `json:"path"`
	Size int64  `json:"size"`
	OID  string `json:"oid"`
	LFS  *struct {
		OID  string `json:"oid"`
		Size int64  `json:"size"`
	} `json:"lfs"`
}

func (s *Source) repoURL() string { return s.opts.Endpoint + "/api/models/" + s.opts.RepoID }

// List resolves the revision to a commit (once) and lists the commit's files, following the
// tree's pagination, up to MaxFiles files.
func (s *Source) List(ctx context.Context) (source.Listing, error) {
	if s.commit == "" {
		resp, err := s.get(ctx, http.MethodGet, s.repoURL()+"/revision/"+url.PathEscape(s.opts.Revision), nil)
		if err != nil {
			return source.Listing{}, err
		}
		var info revisionInfo
		if err := decode(resp, &info); err != nil {
			return source.Listing{}, fmt.Errorf("%s: revision %s: %w", s.opts.RepoID, s.opts.Revision, err)
		}
		if !commitPattern.MatchString(info.SHA) {
			return source.Listing{}, fmt.Errorf("%s: revision %s: the Hub answered sha %q, not a commit id", s.opts.RepoID, s.opts.Revision, info.SHA)
		}
		s.commit = info.SHA
	}
	var files []source.File
	next := s.repoURL() + "/tree/" + s.commit + "?recursive=true&expand=false"
	seen := map[string]bool{next: true}
	for next != "" {
		resp, err := s.get(ctx, http.MethodGet, next, nil)
		if err != nil {
			return source.Listing{}, err
		}
		var page []treeEntry
		if err := decode(resp, &page); err != nil {
			return source.Listing{}, fmt.Errorf("%s: reading the file tree: %w", s.opts.RepoID, err)
		}
		for _, e := range page {
			if e.Type != "file" {
				continue
			}
			if len(files) == s.opts.MaxFiles {
				return source.Listing{}, &source.TooManyFilesError{Source: s.String(), Max: s.opts.MaxFiles,
					Hint: "a repository this large is not cached; copy the model's own files to a repository or an S3 prefix of their own"}
			}
			f := source.File{Path: e.Path, Size: e.Size, Version: e.OID}
			if e.LFS != nil {
				f.Size = e.LFS.Size
				f.Checksums.SHA256 = strings.ToLower(e.LFS.OID)
				f.Version = e.LFS.OID
			} else {
				f.Checksums.GitBlobSHA1 = strings.ToLower(e.OID)
			}
			files = append(files, f)
		}
		if next, err = s.nextPage(next, resp.Header.Get("Link"), seen); err != nil {
			return source.Listing{}, err
		}
	}
	if len(files) == 0 {
		return source.Listing{}, &source.NotFoundError{Err: fmt.Errorf("%s has no files at %s", s.opts.RepoID, s.commit)}
	}
	return source.Listing{Files: files, Revision: s.commit}, nil
}

// decode reads one JSON answer of at most MaxAnswerBytes into v, and closes it.
func decode(resp *http.Response, v any) error {
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswerBytes+1))
	if err != nil {
		return err
	}
	if len(data) > MaxAnswerBytes {
		return fmt.Errorf("the answer is larger than %d MiB, the most prewarm reads of one", MaxAnswerBytes>>20)
	}
	return json.Unmarshal(data, v)
}

var linkNext = regexp.MustCompile(`<([^>]+)>\s*;\s*rel="?next"?`)

// nextPage is the file tree's page after page at (from its Link header), "" when it is the
// last. The token goes with every page, so a next page must be on the Hub itself (the scheme
// and host of the page before), and a page seen before ends the listing with an error rather
// than a loop.
func (s *Source) nextPage(at, link string, seen map[string]bool) (string, error) {
	m := linkNext.FindStringSubmatch(link)
	if m == nil {
		return "", nil
	}
	base, err := url.Parse(at)
	if err != nil {
		return "", err
	}
	next, err := base.Parse(m[1])
	switch {
	case err != nil:
		return "", fmt.Errorf("%s: the file tree's next page %q: %w", s.opts.RepoID, m[1], err)
	case next.Scheme != base.Scheme || next.Host != base.Host:
		return "", fmt.Errorf("%s: the file tree's next page is on %s://%s, not on the Hub (%s://%s): not followed", s.opts.RepoID, next.Scheme, next.Host, base.Scheme, base.Host)
	case seen[next.String()]:
		return "", fmt.Errorf("%s: the file tree's pages lead back to %s", s.opts.RepoID, next)
	}
	seen[next.String()] = true
	return next.String(), nil
}

// OpenRange reads a byte range of a file at the resolved commit, following the Hub's redirect
// to its content host for LFS files.
func (s *Source) OpenRange(ctx context.Context, path string, off, n int64) (io.ReadCloser, error) {
	if s.commit == "" {
		return nil, errors.New("hf: OpenRange before List")
	}
	segs := strings.Split(path, "/")
	for i, seg := range segs {
		segs[i] = url.PathEscape(seg)
	}
	u := s.opts.Endpoint + "/" + s.opts.RepoID + "/resolve/" + s.commit + "/" + strings.Join(segs, "/")
	hdr := http.Header{"Range": {fmt.Sprintf("bytes=%d-%d", off, off+n-1)}}
	resp, err := s.get(ctx, http.MethodGet, u, hdr)
	if err != nil {
		return nil, err
	}
	wholeFromStart := resp.StatusCode == http.StatusOK && off == 0
	if resp.StatusCode != http.StatusPartialContent && !wholeFromStart {
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %s: range request answered %s", s.opts.RepoID, path, resp.Status)
	}
	return resp.Body, nil
}
