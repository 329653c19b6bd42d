package config_test

import (
	"testing"
	"time"

	"github.com/prewarm/prewarm/internal/config"
)

// The configuration a file that sets nothing gets.
func TestDefault(t *testing.T) {
	if def := config.Default(); len(def.CacheRoots) != 1 || def.CacheRoots[0].Path != config.DefaultCacheRoot ||
		def.Controller.GateTimeout.Duration != 30*time.Minute || def.Agent.PartSizeBytes() != 16<<20 || def.Agent.MaxParallel != 2 ||
		def.Controller.PrefetchSizeLimitBytes() != 64<<30 || def.Agent.MaxScratchBytesValue() != 100<<30 {
		t.Errorf("defaults %+v", def)
	}
}
