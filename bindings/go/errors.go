// errors.go - kvx failures as Go errors.
//
// A failed call returns an *Error carrying the kvx code (a KVX_E* value, or
// a negative errno passed through from the OS), its name ("KVX_EPAGECRC",
// "ENOSPC") and the library's message, which names the field and the
// problem. The message is captured in the same C call that failed (the
// library keeps it thread-locally, and a goroutine may change threads).
//
// Compare with errors.Is. Each code matches its own exact sentinel
// (ErrPageCRC, ErrMetaCRC, ...) and the broader class sentinels it belongs
// to: a page CRC mismatch is both ErrPageCRC and ErrCorrupt; a misaligned
// section is ErrAlign and ErrFormat. A negative errno unwraps to its
// syscall.Errno, so errors.Is(err, fs.ErrNotExist) and
// errors.Is(err, syscall.ENOSPC) work too. A canceled Fetch or Warmup
// matches ErrCanceled and the context's own error.
package kvx

/*
#include "shim.h"
*/
import "C"

import (
	"syscall"
	"unsafe"
)

// The kvx codes, tied to the header's table.
const (
	CodeFormat      = int(C.KVX_EFORMAT)
	CodeShape       = int(C.KVX_ESHAPE)
	CodeVersion     = int(C.KVX_EVERSION)
	CodeCorrupt     = int(C.KVX_ECORRUPT)
	CodeNotFound    = int(C.KVX_ENOTFOUND)
	CodeCapacity    = int(C.KVX_ECAPACITY)
	CodeMagic       = int(C.KVX_EMAGIC)
	CodeTrunc       = int(C.KVX_ETRUNC)
	CodeAlign       = int(C.KVX_EALIGN)
	CodeOverlap     = int(C.KVX_EOVERLAP)
	CodeOverflow    = int(C.KVX_EOVERFLOW)
	CodeQuant       = int(C.KVX_EQUANT)
	CodeDuplicate   = int(C.KVX_EDUPLICATE)
	CodeShardID     = int(C.KVX_ESHARDID)
	CodePage        = int(C.KVX_EPAGE)
	CodeTokens      = int(C.KVX_ETOKENS)
	CodeHash        = int(C.KVX_EHASH)
	CodeLineage     = int(C.KVX_ELINEAGE)
	CodeMetaCRC     = int(C.KVX_EMETACRC)
	CodePageCRC     = int(C.KVX_EPAGECRC)
	CodeModel       = int(C.KVX_EMODEL)
	CodeBusy        = int(C.KVX_EBUSY)
	CodeFull        = int(C.KVX_EFULL)
	CodeNoGPU       = int(C.KVX_ENOGPU)
	CodeNoCUDA      = int(C.KVX_ENOCUDA)
	CodeMemlock     = int(C.KVX_EMEMLOCK)
	CodeInvalid     = int(C.KVX_EINVALID)
	CodeSpectral    = int(C.KVX_ESPECTRAL)
	CodePath        = int(C.KVX_EPATH)
	CodeCanceled    = int(C.KVX_ECANCELED)
	CodeAmbiguous   = int(C.KVX_EAMBIGUOUS)
	CodeUnverified  = int(C.KVX_EUNVERIFIED)
	CodeStale       = int(C.KVX_ESTALE)
	CodeLossy       = int(C.KVX_ELOSSY)
	CodeDropped     = int(C.KVX_EDROPPED)
	CodeNotHeld     = int(C.KVX_ENOTHELD)
	CodeUnavailable = int(C.KVX_EUNAVAILABLE)
)

// Error is a kvx failure.
type Error struct {
	Code    int    // KVX_E* (kvx's range, -30000 and below) or -errno
	Name    string // "KVX_EPAGECRC", "ENOSPC", ...
	Message string // the library's message: the field and the problem
	cause   error  // the context error of a cancellation
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "kvx: " + e.Name
	}
	return "kvx: " + e.Name + ": " + e.Message
}

// Unwrap gives the syscall.Errno of a passed-through OS error, or the
// context's error of a cancellation.
func (e *Error) Unwrap() error {
	if e.cause != nil {
		return e.cause
	}
	if e.Code < 0 && e.Code > -30000 {
		return syscall.Errno(-e.Code)
	}
	return nil
}

// Is reports whether target is e's exact sentinel (same code) or a class
// sentinel e's code belongs to.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	if t == e {
		return true
	}
	if cls, ok := classes[t]; ok {
		for _, c := range cls {
			if c == e.Code {
				return true
			}
		}
		return false
	}
	return t != ErrClosed && t.Code == e.Code
}

func sentinel(code int) *Error { return &Error{Code: code, Name: errName(code)} }

// Exact sentinels: one code each.
var (
	ErrMagic     = sentinel(CodeMagic)
	ErrTruncated = sentinel(CodeTrunc)
	ErrAlign     = sentinel(CodeAlign)
	ErrOverlap   = sentinel(CodeOverlap)
	ErrOverflow  = sentinel(CodeOverflow)
	ErrQuant     = sentinel(CodeQuant)
	ErrDuplicate = sentinel(CodeDuplicate)
	ErrShardID   = sentinel(CodeShardID)
	ErrPage      = sentinel(CodePage)
	ErrTokens    = sentinel(CodeTokens)
	ErrHash      = sentinel(CodeHash)
	ErrLineage   = sentinel(CodeLineage)
	ErrMetaCRC   = sentinel(CodeMetaCRC)
	ErrPageCRC   = sentinel(CodePageCRC)
	ErrModel     = sentinel(CodeModel)
	ErrFull      = sentinel(CodeFull)
	ErrNoCUDA    = sentinel(CodeNoCUDA)
	ErrSpectral  = sentinel(CodeSpectral)
	ErrPath      = sentinel(CodePath)
	// ErrAmbiguous: a get by hash alone found several verified blocks
	// under the hash (an FNV collision); give the tokens (GetBlock, Prefix)
	// to pick one by prefix digest. Also ErrNotFound: no block is served.
	ErrAmbiguous = sentinel(CodeAmbiguous)
	// ErrUnverified: the hash is held only by unverified blocks (stored
	// without their token ids), which a get by hash never serves. Also
	// ErrNotFound: no block is served.
	ErrUnverified = sentinel(CodeUnverified)
	// ErrStale: the store's index was rebuilt (kvx store reindex from a
	// damaged or lost index) since this Store was opened: Close it and
	// Open it again.
	ErrStale = sentinel(CodeStale)
	// ErrLossy: a value is not exactly representable in the format asked
	// for (a bf16 store exported as EnvelopeV1 holds a value f16 cannot
	// hold); the message names the first element and its value. Export
	// EnvelopeV3 (lossless) or EnvelopeV2 instead.
	ErrLossy = sentinel(CodeLossy)
	// ErrDropped: Flush found that a failed Put since the previous Flush
	// dropped blocks earlier successful Puts had added (the store's one
	// write batch is shared by every goroutine using this Store): those
	// blocks were never stored; put them again. Blocks put after the
	// failure were stored.
	ErrDropped = sentinel(CodeDropped)
	// ErrNotHeld: a tl.kv.v1 chunk named a block this store does not hold
	// (never stored, evicted, or another prompt's under a colliding hash):
	// the sender resends it with its payload (gRPC ABORTED).
	ErrNotHeld = sentinel(CodeNotHeld)
	// ErrUnavailable: the store's shared tier did not answer (a lookup
	// never fails for it: the tier's blocks are misses; docs/TIER.md).
	ErrUnavailable = sentinel(CodeUnavailable)
)

// Class sentinels: a family of codes each.
var (
	// ErrNotFound: no such block, coordinate, hash or entry; also a get by
	// hash that serves nothing because the hash is ambiguous (ErrAmbiguous)
	// or held only unverified (ErrUnverified).
	ErrNotFound = sentinel(CodeNotFound)
	// ErrCorrupt: data is damaged (page CRC, meta CRC, lineage, truncation,
	// a damaged store file).
	ErrCorrupt = sentinel(CodeCorrupt)
	// ErrFormat: malformed data (bad magic, alignment, overlap, overflow,
	// quant, duplicate, shard byte, page, tokens, hash rule, spectral,
	// truncation).
	ErrFormat = sentinel(CodeFormat)
	// ErrShape: dimensions or model differ from what was expected.
	ErrShape = sentinel(CodeShape)
	// ErrVersion: an unsupported format or options version.
	ErrVersion = sentinel(CodeVersion)
	// ErrCapacity: a buffer, pool, arena or store is full.
	ErrCapacity = sentinel(CodeCapacity)
	// ErrBusy: another writer holds the store, or a Fetcher still holds an
	// unreleased batch.
	ErrBusy = sentinel(CodeBusy)
	// ErrNoGPU: no usable GPU, or kvx was built without CUDA.
	ErrNoGPU = sentinel(CodeNoGPU)
	// ErrMemlock: memory could not be locked or registered.
	ErrMemlock = sentinel(CodeMemlock)
	// ErrInvalid: an invalid argument (ErrClosed and ErrPath included).
	ErrInvalid = sentinel(CodeInvalid)
	// ErrCanceled: a Fetch or Warmup was canceled (the error also matches
	// the context's error).
	ErrCanceled = sentinel(CodeCanceled)
)

// ErrClosed is returned by calls on a closed handle. It is also ErrInvalid.
var ErrClosed = &Error{Code: CodeInvalid, Name: errName(CodeInvalid), Message: "handle is closed"}

var classes = map[*Error][]int{
	ErrNotFound: {CodeNotFound, CodeAmbiguous, CodeUnverified},
	ErrCorrupt:  {CodeCorrupt, CodePageCRC, CodeMetaCRC, CodeLineage, CodeTrunc},
	ErrFormat: {CodeFormat, CodeMagic, CodeTrunc, CodeAlign, CodeOverlap, CodeOverflow, CodeQuant,
		CodeDuplicate, CodeShardID, CodePage, CodeTokens, CodeHash, CodeSpectral},
	ErrShape:    {CodeShape, CodeModel},
	ErrVersion:  {CodeVersion},
	ErrCapacity: {CodeCapacity, CodeFull},
	ErrBusy:     {CodeBusy},
	ErrNoGPU:    {CodeNoGPU, CodeNoCUDA},
	ErrMemlock:  {CodeMemlock},
	ErrInvalid:  {CodeInvalid, CodePath},
	ErrCanceled: {CodeCanceled},
}

func errName(code int) string { return C.GoString(C.kvx_err_name(C.int(code))) }

// newError builds the error of a code with msg ("" = the code's text).
func newError(code int, msg string) *Error {
	if msg == "" {
		msg = C.GoString(C.kvx_strerror(C.int(code)))
	}
	return &Error{Code: code, Name: errName(code), Message: msg}
}

// check turns a shim result into nil or an *Error, freeing the message.
func check(r C.gokvx_rc) error {
	if r.rc == 0 {
		return nil
	}
	msg := ""
	if r.msg != nil {
		msg = C.GoString(r.msg)
		C.free(unsafe.Pointer(r.msg))
	}
	return newError(int(r.rc), msg)
}

// canceled is the error of a Fetch or Warmup stopped by its context.
func canceled(cause error, what string) *Error {
	e := newError(CodeCanceled, what+": "+cause.Error())
	e.cause = cause
	return e
}
