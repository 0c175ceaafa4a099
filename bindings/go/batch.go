package kvx

/*
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"sync"
	"unsafe"
)

// Batch is a write batch of its own (kvx_store_batch): its Flush
// acknowledges exactly the blocks put into it since its previous Flush,
// and a failed Put or Flush drops only its own unflushed blocks, never
// another Batch's or those of the Store's own Put. Give each writing
// goroutine its own Batch; calls on one Batch serialize. Close drops the
// unflushed blocks. After Store.Close every call but Close returns
// ErrClosed (the store dropped the batch's unflushed blocks).
//
// A copy of a Batch value is the same batch: closing either closes both.
type Batch struct{ *batchHandle }

// batchHandle is shared by copies of a Batch, and carries the finalizer.
type batchHandle struct {
	s  *Store
	mu sync.Mutex
	c  *C.kvx_store_batch
}

// NewBatch makes a write batch on a writer Store (ErrInvalid on a
// read-only one).
func (s *Store) NewBatch() (*Batch, error) {
	cs, err := s.acquire()
	if err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	var cb *C.kvx_store_batch
	if err := check(C.gokvx_batch_create(&cb, cs)); err != nil {
		return nil, err
	}
	b := &Batch{&batchHandle{s: s, c: cb}}
	runtime.SetFinalizer(b.batchHandle, func(h *batchHandle) { (&Batch{h}).Close() })
	return b, nil
}

// use holds the store open (its read lock) and the batch for one call;
// the caller unlocks both with b.done().
func (b *Batch) use() (*C.kvx_store_batch, error) {
	if b == nil || b.batchHandle == nil {
		return nil, ErrClosed
	}
	if _, err := b.s.acquire(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	if b.c == nil {
		b.mu.Unlock()
		b.s.mu.RUnlock()
		return nil, ErrClosed
	}
	return b.c, nil
}

func (b *Batch) done() {
	b.mu.Unlock()
	b.s.mu.RUnlock()
}

// Put is Store.Put into this batch: nothing it writes is visible or
// durable until this batch's Flush returns nil.
func (b *Batch) Put(tokens []uint32, pages []byte, scales []float32) (int, error) {
	if b == nil || b.batchHandle == nil {
		return 0, ErrClosed
	}
	n, err := b.s.pageCount("Batch.Put", pages, scales)
	if n == 0 || err != nil {
		return 0, err
	}
	cb, err := b.use()
	if err != nil {
		return 0, err
	}
	defer b.done()
	var ctok *C.uint32_t
	if len(tokens) > 0 {
		ctok = (*C.uint32_t)(&tokens[0])
	}
	var csc *C.float
	if len(scales) > 0 {
		csc = (*C.float)(&scales[0])
	}
	r := C.gokvx_batch_put(cb, ctok, C.size_t(len(tokens)), unsafe.Pointer(&pages[0]), C.size_t(n), csc)
	return int(r.n), check(r)
}

// PutEnvelope is Store.PutEnvelope into this batch.
func (b *Batch) PutEnvelope(env []byte, tokens []uint32) (int, error) {
	if len(env) == 0 {
		return 0, newError(CodeFormat, "Batch.PutEnvelope: empty envelope")
	}
	cb, err := b.use()
	if err != nil {
		return 0, err
	}
	defer b.done()
	var ctok *C.uint32_t
	if len(tokens) > 0 {
		ctok = (*C.uint32_t)(&tokens[0])
	}
	r := C.gokvx_batch_put_envelope(cb, unsafe.Pointer(&env[0]), C.size_t(len(env)), ctok, C.size_t(len(tokens)))
	return int(r.n), check(r)
}

// Flush makes every block put into this batch since its previous Flush
// durable and visible; nil is their acknowledgement. ErrDropped: a failed
// Put since then dropped blocks of this batch's earlier Puts (never
// stored: put them again).
func (b *Batch) Flush() error {
	cb, err := b.use()
	if err != nil {
		return err
	}
	defer b.done()
	return check(C.gokvx_batch_flush(cb))
}

// Close drops the batch's unflushed blocks (never acknowledged) and frees
// it. Safe to call more than once, and after Store.Close.
func (b *Batch) Close() error {
	if b == nil || b.batchHandle == nil {
		return nil
	}
	open := false
	if _, err := b.s.acquire(); err == nil {
		open = true
	}
	b.mu.Lock()
	if b.c != nil {
		C.kvx_store_batch_destroy(b.c)
		b.c = nil
		runtime.SetFinalizer(b.batchHandle, nil)
	}
	b.mu.Unlock()
	if open {
		b.s.mu.RUnlock()
	}
	return nil
}
