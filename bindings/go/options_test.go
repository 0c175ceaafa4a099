package kvx

import "testing"

// The Default*Options come from the library's *_options_init functions:
// they carry its non-zero defaults (NodeAuto, the discard sink), and 0
// wherever the library picks the value itself.
func TestDefaultOptionsFromLibrary(t *testing.T) {
	p := DefaultPoolOptions()
	if p != (PoolOptions{NUMANode: NodeAuto}) {
		t.Fatalf("DefaultPoolOptions = %+v, want 64 MiB (0), NodeAuto, GPU 0, locked", p)
	}
	w := DefaultWarmupOptions()
	if w.NUMANode != NodeAuto || w.Sink != SinkDiscard || w.IOMode != IOAuto || w.NoVerify || w.Buffered ||
		w.QueueDepth != 0 || w.ChunkBytes != 0 || w.GPU != nil {
		t.Fatalf("DefaultWarmupOptions = %+v", w)
	}
}
