// Package s3fixture runs a real S3 server (versitygw, built by hack/testbin.sh) on loopback for
// tests and benchmarks. It has no Kubernetes imports, so engine tests can use it.
package s3fixture

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/prewarm/prewarm/internal/testutil/ports"
)

// Credentials of the server's root user.
const (
	AccessKey = "prewarm-test"
	SecretKey = "prewarm-test-secret"
	Region    = "us-west-2"
)

// Server is a running versitygw with a posix backend in a temporary directory.
type Server struct {
	// Endpoint is the server's URL, e.g. http://127.0.0.1:40123.
	Endpoint string
	// Dir is the backend directory: one subdirectory per bucket.
	Dir string
	// Client is an S3 client for the server (path-style).
	Client *s3.Client

	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
}

// BinDir finds hack/testbin.sh's folder: $PREWARM_TESTBIN_DIR, or the script's answer.
func BinDir() (string, error) {
	if d := os.Getenv("PREWARM_TESTBIN_DIR"); d != "" {
		return d, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		script := filepath.Join(dir, "hack", "testbin.sh")
		if _, err := os.Stat(script); err == nil {
			out, err := exec.Command("bash", script, "--print").Output()
			return strings.TrimSpace(string(out)), err
		}
		if filepath.Dir(dir) == dir {
			return "", errors.New("hack/testbin.sh not found above the working directory")
		}
		dir = filepath.Dir(dir)
	}
}

// Start runs versitygw on a free loopback port with its data under dir (created if needed).
func Start(dir string) (*Server, error) { return StartLogged(dir, "") }

// StartLogged is Start with versitygw's log at logPath (default: a file in the temp folder).
func StartLogged(dir, logPath string) (*Server, error) { return StartOn("127.0.0.1", dir, logPath) }

// StartOn is StartLogged listening on host (an IP address of this machine) instead of loopback,
// for clients in pods.
func StartOn(host, dir, logPath string) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(bin, "versitygw")
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("versitygw is not built: run `make testbin` (%w)", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var lastErr error
	for range 3 { // the free port can be taken between probe and bind
		port, err := ports.Free(host)
		if err != nil {
			return nil, err
		}
		s, err := start(path, dir, host, port, logPath)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func start(bin, dir, host string, port int, logPath string) (*Server, error) {
	if logPath == "" {
		logPath = filepath.Join(os.TempDir(), fmt.Sprintf("versitygw-%d.log", port))
	}
	s := &Server{
		Endpoint: "http://" + net.JoinHostPort(host, strconv.Itoa(port)),
		Dir:      dir,
		logPath:  logPath,
		done:     make(chan struct{}),
	}
	logf, err := os.Create(s.logPath)
	if err != nil {
		return nil, err
	}
	s.cmd = exec.Command(bin, "--access", AccessKey, "--secret", SecretKey, "--region", Region,
		"--port", net.JoinHostPort(host, strconv.Itoa(port)), "--quiet", "posix", dir)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	go func() { _ = s.cmd.Wait(); logf.Close(); close(s.done) }()
	s.Client = s3.New(s3.Options{
		Region:       Region,
		BaseEndpoint: aws.String(s.Endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := s.Client.ListBuckets(ctx, &s3.ListBucketsInput{})
		cancel()
		if err == nil {
			return s, nil
		}
		select {
		case <-s.done:
			log, _ := os.ReadFile(s.logPath)
			return nil, fmt.Errorf("versitygw exited: %s", log)
		default:
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("versitygw not answering on %s: %w", s.Endpoint, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// CPUSeconds is the user and system time the server process has used so far (from
// /proc/PID/stat), for benchmarks that account for the machine's CPU.
func (s *Server) CPUSeconds() (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: count fields after it.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc stat: %q", b)
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return (utime + stime) / 100, nil // USER_HZ is 100 on Linux
}

// Stop ends the server. The data directory stays.
func (s *Server) Stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
	}
	_ = os.Remove(s.logPath)
}

// Restart stops the server and starts it again on the same port and data.
func (s *Server) Restart() error {
	s.Stop()
	host, port, err := net.SplitHostPort(strings.TrimPrefix(s.Endpoint, "http://"))
	if err != nil {
		return err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return err
	}
	bin, err := BinDir()
	if err != nil {
		return err
	}
	var n *Server
	for range 20 {
		if n, err = start(filepath.Join(bin, "versitygw"), s.Dir, host, p, s.logPath); err == nil {
			*s = *n
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// CreateBucket creates a bucket.
func (s *Server) CreateBucket(ctx context.Context, bucket string) error {
	_, err := s.Client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &bucket})
	return err
}

// Put uploads one object in a single part (so its ETag is the MD5 of its bytes). A body that
// cannot seek (a generated stream) is spooled through a temporary file first: the client signs
// the payload, which takes a second read.
func (s *Server) Put(ctx context.Context, bucket, key string, body io.Reader, size int64) error {
	if _, ok := body.(io.ReadSeeker); !ok {
		f, err := os.CreateTemp("", "s3fixture-put-")
		if err != nil {
			return err
		}
		defer os.Remove(f.Name())
		defer f.Close()
		if _, err := io.CopyN(f, body, size); err != nil {
			return fmt.Errorf("spooling %s: %w", key, err)
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		body = f
	}
	_, err := s.Client.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: body, ContentLength: aws.Int64(size)})
	return err
}

// PutBytes uploads data as one object.
func (s *Server) PutBytes(ctx context.Context, bucket, key string, data []byte) error {
	return s.Put(ctx, bucket, key, bytes.NewReader(data), int64(len(data)))
}

// PutMultipart uploads data as one object in parts of partSize bytes: its ETag is then not an
// MD5 of the bytes, and it has no full-object digest (only CRCs, whatever the client sends).
func (s *Server) PutMultipart(ctx context.Context, bucket, key string, data []byte, partSize int) error {
	up, err := s.Client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: &bucket, Key: &key})
	if err != nil {
		return err
	}
	var parts []types.CompletedPart
	for n, off := int32(1), 0; off < len(data); n, off = n+1, off+partSize {
		body := data[off:min(off+partSize, len(data))]
		out, err := s.Client.UploadPart(ctx, &s3.UploadPartInput{Bucket: &bucket, Key: &key, UploadId: up.UploadId,
			PartNumber: aws.Int32(n), Body: bytes.NewReader(body), ContentLength: aws.Int64(int64(len(body)))})
		if err != nil {
			return fmt.Errorf("uploading part %d of %s: %w", n, key, err)
		}
		parts = append(parts, types.CompletedPart{PartNumber: aws.Int32(n), ETag: out.ETag,
			ChecksumCRC32: out.ChecksumCRC32, ChecksumCRC32C: out.ChecksumCRC32C, ChecksumCRC64NVME: out.ChecksumCRC64NVME})
	}
	_, err = s.Client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: &bucket, Key: &key, UploadId: up.UploadId,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}})
	return err
}
