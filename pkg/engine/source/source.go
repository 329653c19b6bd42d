// Package source defines what the download engine needs of a place that holds a model's files:
// a listing with sizes and checksums, and byte ranges of each file.
package source

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
)

// File is one file of a model.
type File struct {
	// Path is the file's path relative to the model's root, slash-separated.
	Path string `json:"path"`
	// Size is the file's size in bytes.
	Size int64 `json:"size"`
	// Checksums are what the source can vouch for; empty fields are unknown.
	Checksums Checksums `json:"checksums,omitempty"`
	// Version identifies this content at the source (an S3 ETag or version id, a Git blob id):
	// a later listing with another Version means the file changed.
	Version string `json:"version,omitempty"`
}

// Checksums of a file's whole content, lowercase hex.
type Checksums struct {
	SHA256 string `json:"sha256,omitempty"`
	// SHA1 is an S3 full-object SHA-1 checksum, hex.
	SHA1 string `json:"sha1,omitempty"`
	MD5  string `json:"md5,omitempty"`
	// CRC32C and CRC64NVME are the S3 full-object checksums, base64 as S3 sends them.
	CRC32C    string `json:"crc32c,omitempty"`
	CRC64NVME string `json:"crc64nvme,omitempty"`
	// GitBlobSHA1 is a git blob id: sha1("blob <size>\x00" + content), as the Hugging Face
	// Hub lists for files not stored in LFS.
	GitBlobSHA1 string `json:"gitBlobSha1,omitempty"`
}

// Empty reports whether the source vouches for no checksum of the file (its size is then all
// there is to check it by).
func (c Checksums) Empty() bool { return c == Checksums{} }

// Digests is c without its CRCs: the checksums that are cryptographic digests. A CRC catches
// damage but is linear, so whoever can change a file's bytes can keep its CRC; no one can make
// other bytes with a given SHA-256, SHA-1 or MD5 (a second preimage) without the source's
// owner having chosen the original for it.
func (c Checksums) Digests() Checksums {
	return Checksums{SHA256: c.SHA256, SHA1: c.SHA1, MD5: c.MD5, GitBlobSHA1: c.GitBlobSHA1}
}

// Cryptographic reports whether the source vouches for the file's content with a digest
// (Digests), not only with its size or a CRC.
func (c Checksums) Cryptographic() bool { return !c.Digests().Empty() }

// ContentRevision names a listing's content when the source has no revision of its own (S3, a
// directory): a digest of every file's path, size and version (ETag and version id, or size and
// modification time). Two listings with the same ContentRevision hold the same files.
func ContentRevision(files []File) string {
	h := sha256.New()
	for _, f := range files {
		fmt.Fprintf(h, "%q %d %q\n", f.Path, f.Size, f.Version)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// Listing is a model's files at one revision.
type Listing struct {
	// Files are the model's files, in a stable order.
	Files []File
	// Revision pins what was listed: a Hugging Face commit, or the engine's ContentRevision of
	// the files for sources without revisions of their own.
	Revision string
}

// Source is a place that holds a model's files.
type Source interface {
	// List returns the model's files with their sizes and known checksums.
	List(ctx context.Context) (Listing, error)
	// OpenRange returns length bytes of the file at path, starting at offset. The reader
	// returns fewer bytes only together with an error.
	OpenRange(ctx context.Context, path string, offset, length int64) (io.ReadCloser, error)
	// String names the source for messages, without credentials.
	String() string
}

// StatusError is an HTTP answer other than success from a remote source.
type StatusError struct {
	// StatusCode is the HTTP status.
	StatusCode int
	// Code is the service's error code when it gave one (S3's Code, the Hub's X-Error-Code).
	Code string
	// Message says what failed, for people.
	Message string
	// RetryAfter is the answer's Retry-After header, when it had one.
	RetryAfter string
}

func (e *StatusError) Error() string {
	if e.Code != "" {
		return fmt.Sprintf("%s (HTTP %d, %s)", e.Message, e.StatusCode, e.Code)
	}
	return fmt.Sprintf("%s (HTTP %d)", e.Message, e.StatusCode)
}

// ErrAccessDenied is matched (errors.Is) by errors that more tries will not fix because the
// credentials are missing or not allowed: a gated or private repository, a denied bucket.
var ErrAccessDenied = errors.New("access denied")

// ErrNotFound is matched by errors for a model, revision or file that does not exist.
var ErrNotFound = errors.New("not found")

// AccessError is an authorisation failure, with what the user must do about it.
type AccessError struct {
	// Gated is true for a Hugging Face gated repository.
	Gated bool
	// Err is the underlying error.
	Err error
	// Hint says what to do, e.g. "pass a token with --token-file".
	Hint string
}

func (e *AccessError) Error() string {
	msg := e.Err.Error()
	if e.Hint != "" {
		msg += ": " + e.Hint
	}
	return msg
}

func (e *AccessError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrAccessDenied) true.
func (e *AccessError) Is(target error) bool { return target == ErrAccessDenied }

// NotFoundError wraps an error for something that does not exist.
type NotFoundError struct{ Err error }

func (e *NotFoundError) Error() string { return e.Err.Error() }

func (e *NotFoundError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrNotFound) true.
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// DefaultMaxFiles is the most files a source lists for one model unless told otherwise. A
// listing with more fails with a *TooManyFilesError as soon as it passes the bound, so a prefix
// or repository of millions of files costs neither the memory of their listing nor a request
// per file. Models hold tens to a few thousand files; the largest public repositories a few
// tens of thousands.
const DefaultMaxFiles = 100_000

// ErrTooManyFiles is matched (errors.Is) by errors for a listing with more files than its
// source allows: listing again will not help.
var ErrTooManyFiles = errors.New("too many files")

// TooManyFilesError says a source holds more files than one model may have.
type TooManyFilesError struct {
	// Source names the source (its String).
	Source string
	// Max is the bound the listing passed.
	Max int
	// Hint says what to do instead.
	Hint string
}

func (e *TooManyFilesError) Error() string {
	msg := fmt.Sprintf("%s holds more than %d files, the most prewarm lists for one model", e.Source, e.Max)
	if e.Hint != "" {
		msg += ": " + e.Hint
	}
	return msg
}

// Is makes errors.Is(err, ErrTooManyFiles) true.
func (e *TooManyFilesError) Is(target error) bool { return target == ErrTooManyFiles }

// MaxFiles is n, or DefaultMaxFiles when n is not positive.
func MaxFiles(n int) int {
	if n <= 0 {
		return DefaultMaxFiles
	}
	return n
}

// Retryable reports whether err is worth another try: server errors, throttling, timeouts,
// resets and bodies cut short. Access, not-found and too-many-files errors, and cancellation,
// are not.
func Retryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, ErrAccessDenied) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrTooManyFiles) {
		return false
	}
	var se *StatusError
	if errors.As(err, &se) {
		return se.StatusCode >= 500 || se.StatusCode == http.StatusTooManyRequests || se.StatusCode == http.StatusRequestTimeout
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, ErrTransient)
}

// ErrTransient marks an error a source knows to be passing (e.g. the SDK's retryable class).
var ErrTransient = errors.New("transient")
