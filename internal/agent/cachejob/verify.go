package cachejob

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	prewarmv1alpha1 "github.com/prewarm/prewarm/api/prewarm/v1alpha1"
	"github.com/prewarm/prewarm/pkg/engine"
	"github.com/prewarm/prewarm/pkg/engine/source"
)

// repair fetches the damaged files again. done is false when the source has changed since the
// cache was made, and the whole model must be fetched again instead.
func (j *Job) repair(ctx context.Context, model string, damaged []engine.Damage) (wait time.Duration, ok, done bool) {
	paths := make([]string, len(damaged))
	for i, d := range damaged {
		paths[i] = d.Path
	}
	var res engine.Result
	err := j.download(ctx, func(eng *engine.Engine, src source.Source) error {
		var err error
		res, err = eng.Repair(ctx, src, model, paths)
		return err
	})
	switch {
	case errors.Is(err, engine.ErrSourceChanged):
		ctrl.LoggerFrom(ctx).Info("the source changed since the cache was made; fetching the whole model again")
		return 0, false, false
	case err != nil:
		if ctx.Err() != nil {
			return 0, false, true
		}
		reason, msg, wait := j.classify(err)
		j.fail(reason, "repairing: "+msg)
		return wait, false, true
	}
	j.env.Metrics.Repaired.Add(float64(len(paths)))
	ctrl.LoggerFrom(ctx).Info("cache repaired", "files", len(paths), "fetched", res.Fetched)
	wait, ok = j.settle(ctx, model, "repaired")
	return wait, ok, true
}

// verifyContent reads the whole cache back against its checksums, at most VerifyRate bytes per
// second. The cache stays Ready meanwhile: it was whole by size, and was verified when written.
func (j *Job) verifyContent(ctx context.Context, model string) (*engine.Manifest, []engine.Damage, error) {
	var last int64
	m, damaged, err := engine.Check(ctx, model, engine.CheckOptions{Content: true, Limiter: j.env.VerifyLimiter, Read: func(n int64) {
		j.env.Metrics.Verified.Add(float64(n - last))
		last = n
	}})
	if err == nil && len(damaged) == 0 {
		j.setVerified()
		ctrl.LoggerFrom(ctx).Info("cache content verified", "bytes", last)
	}
	return m, damaged, err
}

func (j *Job) verifyDue() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	v := j.status.LastVerifiedTime
	return v == nil || j.env.Now().Sub(v.Time) >= j.env.VerifyInterval
}

func (j *Job) setVerified() {
	j.Set(func(st *prewarmv1alpha1.CacheStatus) { st.LastVerifiedTime = stamp(j.env.Now()) })
}

// untilNextCheck is the wait before a Ready cache is checked again: the cheap re-check, or the
// content verification if that comes first.
func (j *Job) untilNextCheck() time.Duration {
	e := j.env
	j.mu.Lock()
	v := j.status.LastVerifiedTime
	j.mu.Unlock()
	wait := e.RecheckInterval
	if v != nil {
		wait = min(wait, max(time.Second, e.VerifyInterval-e.Now().Sub(v.Time)))
	}
	return wait
}

// damageMessage says, for people, which files are damaged (the first few) out of how many.
func damageMessage(damaged []engine.Damage, files int) string {
	var parts []string
	for i, d := range damaged {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d more", len(damaged)-3))
			break
		}
		parts = append(parts, d.Path+": "+d.Problem)
	}
	return fmt.Sprintf("%d of %d files damaged (%s)", len(damaged), files, strings.Join(parts, "; "))
}
