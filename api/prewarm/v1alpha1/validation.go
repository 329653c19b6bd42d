package v1alpha1

import (
	"regexp"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation/field"

	v1 "github.com/prewarm/prewarm/api/v1"
)

// A node's request list and its status are each written whole, for every cache at once: one
// entry the API server refuses would keep every cache of the node, of every namespace, from
// being asked or reported. So the writers check each entry against the schema's limits before
// they write (Validate), and what fails stays on its own cache. The limits are the markers on
// the types; TestValidateFollowsTheCRD keeps the two in step.

// uidPattern is a CacheRequest's and a CacheStatus's uid.
var uidPattern = regexp.MustCompile(`^[0-9a-f-]{36}$`)

// Validate checks r against the NodeCache schema's limits (lengths, counts, patterns, the
// source's rules): what the API server would refuse, with path as r's place.
func (r CacheRequest) Validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if !uidPattern.MatchString(r.UID) {
		errs = append(errs, field.Invalid(path.Child("uid"), r.UID, "must be a UID of 36 lower-case hex digits and dashes"))
	}
	errs = append(errs, maxLen(path.Child("namespace"), r.Namespace, 63)...)
	errs = append(errs, maxLen(path.Child("name"), r.Name, 253)...)
	errs = append(errs, maxLen(path.Child("root"), r.Root, 255)...)
	errs = append(errs, r.Source.Validate(path.Child("source"))...)
	if c := r.Credentials; c != nil {
		p := path.Child("credentials")
		errs = append(errs, maxLen(p.Child("keyID"), c.KeyID, 64)...)
		errs = append(errs, maxLen(p.Child("digest"), c.Digest, 64)...)
		errs = append(errs, maxLen(p.Child("sealed"), c.Sealed, MaxSealedLength)...)
	}
	errs = append(errs, maxLen(path.Child("retainedSince"), r.RetainedSince, 64)...)
	if len(r.Peers) > 64 {
		errs = append(errs, field.TooMany(path.Child("peers"), len(r.Peers), 64))
	}
	for i, p := range r.Peers {
		errs = append(errs, maxLen(path.Child("peers").Index(i).Child("node"), p.Node, 253)...)
		errs = append(errs, maxLen(path.Child("peers").Index(i).Child("address"), p.Address, 261)...)
	}
	if no := r.Refused; no != nil {
		errs = append(errs, maxLen(path.Child("refused", "reason"), no.Reason, 64)...)
		errs = append(errs, maxLen(path.Child("refused", "message"), no.Message, 1024)...)
	}
	return errs
}

// MaxSealedLength is the most sealed credentials take in a request (base64).
const MaxSealedLength = 8192

// Validate checks s against the NodeCache schema's limits and rules, with path as its place.
func (s CacheSource) Validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, maxLen(path.Child("bucket"), s.Bucket, 63)...)
	errs = append(errs, maxLen(path.Child("prefix"), s.Prefix, 1024)...)
	errs = append(errs, maxLen(path.Child("region"), s.Region, 32)...)
	errs = append(errs, maxLen(path.Child("repoID"), s.RepoID, 256)...)
	errs = append(errs, maxLen(path.Child("revision"), s.Revision, 128)...)
	errs = append(errs, maxLen(path.Child("fileSystemID"), s.FileSystemID, 64)...)
	errs = append(errs, maxLen(path.Child("path"), s.Path, 1024)...)
	switch s.Type {
	case v1.ModelSourceS3:
		if s.Bucket == "" || s.RepoID != "" || s.FileSystemID != "" {
			errs = append(errs, field.Invalid(path, s.String(), "an s3 source has a bucket and no repoID or fileSystemID"))
		}
	case v1.ModelSourceHuggingFace:
		if s.RepoID == "" || s.Bucket != "" || s.FileSystemID != "" {
			errs = append(errs, field.Invalid(path, s.String(), "a huggingface source has a repoID and no bucket or fileSystemID"))
		}
	case v1.ModelSourceFSx:
		if s.FileSystemID == "" || s.Bucket != "" || s.RepoID != "" {
			errs = append(errs, field.Invalid(path, s.String(), "an fsx source has a fileSystemID and no bucket or repoID"))
		}
	default:
		errs = append(errs, field.NotSupported(path.Child("type"), s.Type, []v1.ModelSourceType{v1.ModelSourceS3, v1.ModelSourceHuggingFace, v1.ModelSourceFSx}))
	}
	return errs
}

// maxLen refuses a value longer than n characters, as the API server counts a maxLength.
func maxLen(path *field.Path, v string, n int) field.ErrorList {
	if utf8.RuneCountInString(v) > n {
		return field.ErrorList{field.TooLongCharacters(path, v, n)}
	}
	return nil
}

// Validate checks s, an agent's report on one cache, against the NodeCache schema's limits.
func (s CacheStatus) Validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if !uidPattern.MatchString(s.UID) {
		errs = append(errs, field.Invalid(path.Child("uid"), s.UID, "must be a UID of 36 lower-case hex digits and dashes"))
	}
	errs = append(errs, maxLen(path.Child("revision"), s.Revision, 128)...)
	errs = append(errs, maxLen(path.Child("reason"), s.Reason, 64)...)
	errs = append(errs, maxLen(path.Child("message"), s.Message, 1024)...)
	return errs
}

// Validate checks r, an agent's report on one allowed root, against the NodeCache schema's
// limits.
func (r RootStatus) Validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, maxLen(path.Child("path"), r.Path, 255)...)
	errs = append(errs, maxLen(path.Child("nodePath"), r.NodePath, 255)...)
	errs = append(errs, maxLen(path.Child("reason"), r.Reason, 64)...)
	errs = append(errs, maxLen(path.Child("message"), r.Message, 1024)...)
	errs = append(errs, maxLen(path.Child("sharedWith"), r.SharedWith, MaxSharedWith)...)
	errs = append(errs, maxLen(path.Child("kubeletThresholds"), r.KubeletThresholds, MaxKubeletThresholds)...)
	return errs
}
