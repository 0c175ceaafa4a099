//go:build !kvx_system

// The default link: libkvx.a from the repository's CMake build directory
// (../../build, or a -L in CGO_LDFLAGS), its dependencies from their static
// archives; see the package comment in kvx.go and README.md.

package kvx

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#cgo LDFLAGS: -L${SRCDIR}/../../build -l:libkvx.a -l:liburing.a -l:liblmdb.a -l:libnuma.a -lisal -l:libcrypto.a -l:libhiredis.a
#cgo LDFLAGS: -L/usr/local/cuda/lib64 -L${SRCDIR}/nocuda -lcudart_static -ldl -lrt -lpthread -lm
*/
import "C"
