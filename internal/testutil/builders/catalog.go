package builders

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// JumpStartCatalog returns a JumpStart catalog ConfigMap (in namespace) that maps the seed's
// meta-textgeneration-llama-3-1-8b-instruct to repo at commit on a Hugging Face Hub stand-in,
// gated, with the token in each JumpStartModel's namespace's Secret hf-token. Its pods ask for
// no GPU, so they never take one an InferenceEndpointConfig's pods need.
func JumpStartCatalog(namespace, repo, commit string) *corev1.ConfigMap {
	return JumpStartCatalogGPUs(namespace, repo, commit, 0)
}

// JumpStartCatalogGPUs is JumpStartCatalog with pods that ask for gpus GPUs, as the shipped
// catalog's do (1).
func JumpStartCatalogGPUs(namespace, repo, commit string, gpus int) *corev1.ConfigMap {
	resources := ""
	if gpus > 0 {
		resources = fmt.Sprintf("  resources: {limits: {nvidia.com/gpu: \"%d\"}}\n", gpus)
	}
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "prewarm-jumpstart-catalog"},
		Data: map[string]string{"catalog.yaml": fmt.Sprintf(`models:
- modelId: meta-textgeneration-llama-3-1-8b-instruct
  version: 2.1.0
  gated: true
  source:
    modelSourceType: huggingface
    huggingFaceModel: {modelId: %s, commitSHA: %s, tokenSecretRef: {name: hf-token, key: token}}
  image: vllm/vllm-openai:v0.6.3
  args: ["--model=/opt/ml/model", "--port=8080"]
  port: 8080
%s`, repo, commit, resources)},
	}
}
