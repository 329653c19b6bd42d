package serving

import (
	"context"
	"errors"
	"fmt"

	inferencev1 "github.com/prewarm/prewarm/api/v1"
	"github.com/prewarm/prewarm/internal/controller/secrets"
	"github.com/prewarm/prewarm/pkg/engine/source"
)

// resolveHF checks a Hugging Face source before anything is cached or deployed: the token
// Secret exists and holds its key, the token can read the repository, and an empty commitSHA is
// pinned to a commit — the one an existing cache of this parent already holds, else the one the
// branch is at now — so every node, and every cold pod, reads the same revision. It returns
// m's source with the commit (m is left as it is).
func (r *Reconciler) resolveHF(ctx context.Context, m *model, owned []inferencev1.ModelDataCacheConfig) (inferencev1.ModelSourceConfig, *problem) {
	src := m.source
	if src.ModelSourceType != inferencev1.ModelSourceHuggingFace || src.HuggingFaceModel == nil {
		return src, nil
	}
	hfm := src.HuggingFaceModel.DeepCopy()
	src.HuggingFaceModel = hfm

	hfToken, missing, err := secrets.HFToken(ctx, r.APIReader, m.owner.GetNamespace(), hfm.ModelID, hfm.TokenSecretRef)
	token := hfToken.Value
	switch {
	case err != nil:
		return src, &problem{inferencev1.ReasonTokenSecretProblem, err.Error()}
	case missing != "":
		return src, &problem{inferencev1.ReasonTokenSecretProblem, missing}
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
		return src, nil // pinned, and public: nothing to ask the Hub
	}
	commit, err := r.Hub.Resolve(ctx, hfm.ModelID, hfm.CommitSHA, token)
	var access *source.AccessError
	switch {
	case errors.As(err, &access) && token != "":
		return src, &problem{inferencev1.ReasonTokenSecretProblem, fmt.Sprintf(
			"the token in Secret %s/%s cannot read %s: %v", m.owner.GetNamespace(), hfm.TokenSecretRef.Name, hfm.ModelID, err)}
	case errors.As(err, &access):
		return src, &problem{inferencev1.ReasonTokenSecretProblem, fmt.Sprintf(
			"%s is gated or private: name a Secret holding a Hugging Face token in huggingFaceModel.tokenSecretRef (%v)", hfm.ModelID, err)}
	case errors.Is(err, source.ErrNotFound):
		return src, &problem{inferencev1.ReasonSourceUnreachable, fmt.Sprintf("%s: %v", hfm.ModelID, err)}
	case err != nil && hfm.CommitSHA == "":
		return src, &problem{inferencev1.ReasonSourceUnreachable, fmt.Sprintf("resolving %s to a commit: %v (retrying)", hfm.ModelID, err)}
	case err != nil:
		return src, nil // the Hub is out of the controller's reach; the commit is pinned, the agents may reach it
	}
	hfm.CommitSHA = commit
	return src, nil
}
