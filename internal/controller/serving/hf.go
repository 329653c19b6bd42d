package serving

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/pkg/engine/source"
)

// problem is a reason and message that stop a parent from being cached or deployed.
type problem struct{ reason, message string }

// Error lets a step return a problem: reconcileModel reports it on the parent.
func (p *problem) Error() string { return p.reason + ": " + p.message }

// resolveHF checks a Hugging Face source before anything is cached or deployed: the token
// Secret exists and holds its key, the token can read the repository, and an empty commitSHA is
// pinned to a commit — the one an existing cache of this parent already holds, else the one the
// branch is at now — so every node, and every cold pod, reads the same revision. It rewrites
// m.source with the commit.
func (r *Reconciler) resolveHF(ctx context.Context, m *model, owned []inferencev1.ModelDataCacheConfig) *problem {
	if m.source.ModelSourceType != inferencev1.ModelSourceHuggingFace || m.source.HuggingFaceModel == nil {
		return nil
	}
	hfm := m.source.HuggingFaceModel.DeepCopy()
	m.source.HuggingFaceModel = hfm

	token := ""
	if ref := hfm.TokenSecretRef; ref != nil {
		key := ref.Key
		if key == "" {
			key = "token"
		}
		where := fmt.Sprintf("Secret %s/%s (key %s)", m.owner.GetNamespace(), ref.Name, key)
		sec := &corev1.Secret{}
		err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: m.owner.GetNamespace(), Name: ref.Name}, sec)
		optional := ptr.Deref(ref.Optional, false)
		switch {
		case optional && (apierrors.IsNotFound(err) || (err == nil && len(sec.Data[key]) == 0)):
			// An optional token that is not there: the repository is read without one.
		case apierrors.IsNotFound(err):
			return &problem{inferencev1.ReasonTokenSecretProblem, fmt.Sprintf(
				"%s, the Hugging Face token for %s, does not exist; create it: kubectl -n %s create secret generic %s --from-literal=%s=hf_...",
				where, hfm.ModelID, m.owner.GetNamespace(), ref.Name, key)}
		case err != nil:
			return &problem{inferencev1.ReasonTokenSecretProblem, fmt.Sprintf("reading %s: %v", where, err)}
		case len(sec.Data[key]) == 0:
			return &problem{inferencev1.ReasonTokenSecretProblem, fmt.Sprintf("%s has no key %s holding a Hugging Face token for %s", where, key, hfm.ModelID)}
		}
		token = string(sec.Data[key])
	}

	if hfm.CommitSHA == "" {
		for _, c := range owned {
			if h := c.Spec.ModelSourceConfig.HuggingFaceModel; h != nil && h.ModelID == hfm.ModelID && h.CommitSHA != "" && c.DeletionTimestamp.IsZero() {
				hfm.CommitSHA = h.CommitSHA // pinned when the cache was made
				break
			}
		}
	}
	if r.Hub == nil || (hfm.CommitSHA != "" && token == "") {
		return nil // pinned, and public: nothing to ask the Hub
	}
	commit, err := r.Hub.Resolve(ctx, hfm.ModelID, hfm.CommitSHA, token)
	var access *source.AccessError
	switch {
	case errors.As(err, &access) && token != "":
		return &problem{inferencev1.ReasonTokenSecretProblem, fmt.Sprintf(
			"the token in Secret %s/%s cannot read %s: %v", m.owner.GetNamespace(), hfm.TokenSecretRef.Name, hfm.ModelID, err)}
	case errors.As(err, &access):
		return &problem{inferencev1.ReasonTokenSecretProblem, fmt.Sprintf(
			"%s is gated or private: name a Secret holding a Hugging Face token in huggingFaceModel.tokenSecretRef (%v)", hfm.ModelID, err)}
	case errors.Is(err, source.ErrNotFound):
		return &problem{inferencev1.ReasonSourceUnreachable, fmt.Sprintf("%s: %v", hfm.ModelID, err)}
	case err != nil && hfm.CommitSHA == "":
		return &problem{inferencev1.ReasonSourceUnreachable, fmt.Sprintf("resolving %s to a commit: %v (retrying)", hfm.ModelID, err)}
	case err != nil:
		return nil // the Hub is out of the controller's reach; the commit is pinned, the agents may reach it
	}
	hfm.CommitSHA = commit
	return nil
}

// fail records a problem that stops the parent, with a Warning event when it is news.
func (r *Reconciler) fail(ctx context.Context, m *model, st *inferencev1.ParentStatus, p *problem) {
	if prev := apimeta.FindStatusCondition(st.Conditions, inferencev1.ConditionReady); prev == nil || prev.Reason != p.reason || prev.Message != p.message {
		transitionEvent(ctx, r.Recorder, m.owner, corev1.EventTypeWarning, p.reason, "Reconcile", p.message)
	}
	st.State = inferencev1.DeploymentFailed
	setCondition(st, m.owner.GetGeneration(), inferencev1.ConditionReady, metav1.ConditionFalse, p.reason, p.message)
}
