// cstore.go - the C handle, for packages that call kvx.h functions this
// package does not wrap (bindings/go/transfer calls kvx_xfer_*).

package kvx

import "unsafe"

// WithCStore runs f with the store's C handle (a kvx_store * of
// include/kvx.h, as an unsafe.Pointer) while Close waits for f to return.
// f must not close the handle or keep it past its return, nor call the
// Store's own methods (a Close waiting meanwhile would deadlock them: a read
// lock taken twice); a C object it
// creates on the handle (a transfer stream, a lease) must be destroyed
// before the store is closed. ErrClosed after Close. This is the one
// accessor other cgo packages need: cgo types are per package, so they
// convert the pointer to their own C.kvx_store.
func (s *Store) WithCStore(f func(cstore unsafe.Pointer) error) error {
	cs, err := s.acquire()
	if err != nil {
		return err
	}
	defer s.mu.RUnlock()
	return f(unsafe.Pointer(cs))
}

// WithCloseExcluded runs f while Close cannot run (the store's read lock),
// whether the store is open or already closed. It is for destroying C
// objects made on the handle that may outlive it (a transfer stream, a
// lease): kvx_store_close detaches their batches, so a destroy after it
// only frees memory, but one running during it races the close
// (include/kvx.h: no call on the store or its batches during close). f
// must not call the Store's own methods, and WithCloseExcluded must not be
// called from inside WithCStore's f (a read lock taken twice deadlocks
// once a Close waits between the two).
func (s *Store) WithCloseExcluded(f func()) {
	if s == nil || s.storeHandle == nil {
		f()
		return
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	f()
}
