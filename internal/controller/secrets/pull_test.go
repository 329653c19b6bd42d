package secrets

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

var secretName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// The copies of two namespaces' pull secrets never share a name, even where the names joined
// with dashes are the same (team's a-foo and team-a's foo), and a name stays a valid Secret
// name however long its parts.
func TestCopyNamesDoNotCollide(t *testing.T) {
	const cache = "iic-vllm-openai-ml-g5-24xlarge-0123456789abcdef"
	a, b := CopyName(cache, "team", "a-foo"), CopyName(cache, "team-a", "foo")
	if a == b {
		t.Errorf("team/a-foo and team-a/foo are both copied as %s", a)
	}
	if got := CopyName(cache, "team", "a-foo"); got != a {
		t.Errorf("the name is not stable: %s, then %s", a, got)
	}
	long := strings.Repeat("n", 63)
	x, y := CopyName(cache, long, strings.Repeat("s", 253)), CopyName(cache, long, strings.Repeat("s", 252)+"t")
	for _, n := range []string{a, b, x, y} {
		if len(n) > 253 || !secretName.MatchString(n) {
			t.Errorf("%s (%d characters) is not a Secret name", n, len(n))
		}
	}
	if x == y {
		t.Error("two long names that differ only past where they are shortened share a copy")
	}
}

func dockerConfig(ns, name string, pad int) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{"registry.example":{"auth":"` + strings.Repeat("x", pad) + `"}}}`)}}
}

// Only docker config Secrets within the size bound are pull secrets to copy, and only the first
// MaxPullSecrets the service account names; each one left out is named with the rule, and a
// name with no Secret is skipped as the kubelet skips it.
func TestNamespacePullSecrets(t *testing.T) {
	ctx := context.Background()
	objs := []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "opaque"}, Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"token": []byte("t")}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "sa-token"}, Type: corev1.SecretTypeServiceAccountToken},
		dockerConfig("team", "huge", MaxPullSecretBytes),
		dockerConfig("team", "good", 100),
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "legacy"}, Type: corev1.SecretTypeDockercfg,
			Data: map[string][]byte{corev1.DockerConfigKey: []byte(`{"registry.example":{"auth":"x"}}`)}},
	}
	names := []corev1.LocalObjectReference{{Name: "opaque"}, {Name: "sa-token"}, {Name: "huge"}, {Name: "good"}, {Name: "missing"}, {Name: "good"}, {Name: "legacy"}}
	for i := range 4 {
		objs = append(objs, dockerConfig("team", fmt.Sprintf("more-%d", i), 10))
		names = append(names, corev1.LocalObjectReference{Name: fmt.Sprintf("more-%d", i)})
	}
	objs = append(objs, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "default"}, ImagePullSecrets: names})
	r := fake.NewClientBuilder().WithObjects(objs...).Build()

	got, err := NamespacePullSecrets(ctx, r, "team")
	if err != nil {
		t.Fatal(err)
	}
	var usable []string
	for _, s := range got.Usable {
		usable = append(usable, s.Name)
	}
	// Eight names are read: opaque, sa-token, huge, good, missing, legacy, more-0, more-1.
	if diff := cmp.Diff([]string{"good", "legacy", "more-0", "more-1"}, usable); diff != "" {
		t.Errorf("copied (-want +got):\n%s", diff)
	}
	want := []string{
		"Secret team/opaque: its type is Opaque, and only kubernetes.io/dockerconfigjson and kubernetes.io/dockercfg Secrets are pull secrets",
		"Secret team/sa-token: its type is kubernetes.io/service-account-token",
		fmt.Sprintf("Secret team/huge: it holds %d bytes, more than the 32768", len(objs[2].(*corev1.Secret).Data[corev1.DockerConfigJsonKey])+len(corev1.DockerConfigJsonKey)),
		"Secret team/more-2, team/more-3: the service account names 10 pull secrets, and only the first 8 are copied",
	}
	if len(got.Refused) != len(want) {
		t.Fatalf("refused %q, want %d entries", got.Refused, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(got.Refused[i], w) {
			t.Errorf("refusal %d: %q, want it to begin %q", i, got.Refused[i], w)
		}
	}

	// No service account, no pull secrets.
	if got, err := NamespacePullSecrets(ctx, r, "elsewhere"); err != nil || len(got.Usable)+len(got.Refused) != 0 {
		t.Errorf("a namespace without a default service account: %+v, %v", got, err)
	}
}
