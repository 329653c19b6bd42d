// Package config is the operator configuration that prewarm's controller and agents share: the
// node directories caches may be kept under, how S3 and the Hugging Face Hub are reached, and
// where each FSx for Lustre file system is mounted on the nodes. Both binaries read the same
// file (the prewarm-config ConfigMap); a binary's flags of the same names override some of its
// values for that binary alone (docs/operations.md lists which).
package config

// File is where the binaries read the configuration in their pods.
const File = "/etc/prewarm/config.yaml"

// Kind and APIVersion identify the file's format.
const (
	Kind       = "OperatorConfiguration"
	APIVersion = "prewarm.io/v1alpha1"
)
