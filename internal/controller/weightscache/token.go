package weightscache

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller/secrets"
	"github.com/prewarm/prewarm/internal/credentials"
)

// access is how the nodes read a cache's source.
type access struct {
	// creds are sealed to each node's agent; empty: the agents read with their own identity
	// (a source the configuration allows), or anonymously (a public Hugging Face model).
	creds credentials.Credentials
	// version identifies where creds came from (secrets.SecretVersion): a change of it seals
	// them again.
	version string
	// refused, when set, says why the nodes may not read the source at all.
	refused string
	// tokenProblem, when set, says why a Hugging Face token is missing (the nodes download
	// without it).
	tokenProblem string
}

// sourceAccess decides how the nodes read m's source, so that prewarm never reads, with its own
// identity, what m's namespace could not: an S3 source or FSx directory is read with prewarm's
// identity only when the operator configuration's sourceAccess allows it for the namespace;
// another S3 source is read with the namespace's own credentials (s3.credentialsSecret); a
// Hugging Face model with the parent's token, or anonymously.
func (r *Reconciler) sourceAccess(ctx context.Context, m *inferencev1.ModelDataCacheConfig, src prewarmv1alpha1.CacheSource) (access, error) {
	if src.Type == inferencev1.ModelSourceHuggingFace {
		return r.hfToken(ctx, m)
	}
	ok, why := r.Config.SourceAllowed(m.Namespace, src)
	switch {
	case ok:
		return access{}, nil
	case src.Type == inferencev1.ModelSourceFSx:
		return access{refused: why}, nil // a mount has no credentials of its own
	}
	name := r.Config.S3.CredentialsSecret
	if name == "" || r.APIReader == nil {
		return access{refused: why + ", and the configuration names no s3.credentialsSecret through which a namespace provides its own credentials"}, nil
	}
	s := &corev1.Secret{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: name}, s)
	switch {
	case apierrors.IsNotFound(err):
		return access{refused: fmt.Sprintf("%s, and namespace %s has no Secret %s with its own AWS credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)", why, m.Namespace, name)}, nil
	case err != nil:
		return access{}, err
	}
	c := credentials.Credentials{
		AWSAccessKeyID: string(s.Data["AWS_ACCESS_KEY_ID"]), AWSSecretAccessKey: string(s.Data["AWS_SECRET_ACCESS_KEY"]),
		AWSSessionToken: string(s.Data["AWS_SESSION_TOKEN"]),
	}
	if c.AWSAccessKeyID == "" || c.AWSSecretAccessKey == "" {
		return access{refused: fmt.Sprintf("%s, and Secret %s/%s lacks AWS_ACCESS_KEY_ID or AWS_SECRET_ACCESS_KEY", why, m.Namespace, name)}, nil
	}
	return access{creds: c, version: secrets.SecretVersion(s, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")}, nil
}

// hfToken reads the Hugging Face token a cache's source names, if any.
func (r *Reconciler) hfToken(ctx context.Context, m *inferencev1.ModelDataCacheConfig) (access, error) {
	h := m.Spec.ModelSourceConfig.HuggingFaceModel
	if h == nil || h.TokenSecretRef == nil || r.APIReader == nil {
		return access{}, nil
	}
	token, missing, err := secrets.HFToken(ctx, r.APIReader, m.Namespace, h.ModelID, h.TokenSecretRef)
	switch {
	case err != nil:
		return access{}, err
	case missing != "":
		return access{tokenProblem: missing + "; the nodes download without it"}, nil
	case token.Value == "":
		return access{}, nil // an optional token that is not there: the nodes download without one
	}
	return access{creds: credentials.Credentials{HFToken: token.Value}, version: token.Version}, nil
}

// sealFor seals the cache's credentials to node's agent key; nil when there are none. Until the
// agent has published a key they are sealed to no key: the node is asked for the cache (its
// NodeCache then names it, so the key's arrival brings the cache back here), and its agent waits
// for them as it does after a restart, instead of trying the source without them.
func sealFor(nc *prewarmv1alpha1.NodeCache, node, uid string, a access, asked *prewarmv1alpha1.CacheRequest) (*prewarmv1alpha1.SealedCredentials, error) {
	if a.creds.Empty() {
		return nil, nil
	}
	if nc == nil || nc.Status.CredentialsKey == "" {
		return &prewarmv1alpha1.SealedCredentials{}, nil
	}
	var current *prewarmv1alpha1.SealedCredentials
	if asked != nil {
		current = asked.Credentials
	}
	return credentials.Seal(nc.Status.CredentialsKey, node, uid, a.creds, a.version, current)
}

// deleteLegacyToken removes the token copy that earlier versions kept in the operator namespace
// for the agents; credentials are now sealed to each node instead.
func (r *Reconciler) deleteLegacyToken(ctx context.Context, m *inferencev1.ModelDataCacheConfig) error {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: r.Config.OperatorNamespace, Name: "prewarm-token-" + string(m.UID)}}
	return client.IgnoreNotFound(r.Client.Delete(ctx, s))
}
