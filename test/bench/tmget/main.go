// Command tmget downloads an S3 prefix into a directory with aws-sdk-go-v2's transfermanager
// (transfermanager.New: its defaults, or -concurrency), then syncs the files: a baseline make
// bench compares prewarm's engine with.
//
//	tmget -endpoint http://127.0.0.1:7070 -bucket example-bucket -prefix models/m -dest ./m
package main

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

func main() {
	endpoint := flag.String("endpoint", "", "S3 endpoint")
	bucket := flag.String("bucket", "", "bucket")
	prefix := flag.String("prefix", "", "key prefix")
	dest := flag.String("dest", "", "destination directory")
	concurrency := flag.Int("concurrency", 0, "transfermanager Options.Concurrency (0: its default)")
	flag.Parse()
	if err := run(*endpoint, *bucket, *prefix, *dest, *concurrency); err != nil {
		fmt.Fprintln(os.Stderr, "tmget:", err)
		os.Exit(1)
	}
}

func run(endpoint, bucket, prefix, dest string, concurrency int) error {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return err
	}
	client := s3.NewFromConfig(cfg, func(o *s3.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
			o.UsePathStyle = true
		}
	})
	tm := transfermanager.New(client, func(o *transfermanager.Options) {
		if concurrency > 0 {
			o.Concurrency = concurrency
		}
	})
	if _, err := tm.DownloadDirectory(ctx, &transfermanager.DownloadDirectoryInput{
		Bucket: aws.String(bucket), KeyPrefix: aws.String(prefix), Destination: aws.String(dest),
	}); err != nil {
		return err
	}
	// Durable like the others: every file synced.
	return filepath.WalkDir(dest, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Sync()
	})
}
