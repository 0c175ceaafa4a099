//go:build !kvx_system

// The default link, as the core package's (../link_build.go): libkvx.a
// from the repository's CMake build directory (../../../build, or a -L in
// CGO_LDFLAGS), its dependencies from their static archives.

package transfer

/*
#cgo CFLAGS: -I${SRCDIR}/../../../include
#cgo LDFLAGS: -L${SRCDIR}/../../../build -l:libkvx.a -l:liburing.a -l:liblmdb.a -l:libnuma.a -lisal -l:libcrypto.a -l:libhiredis.a
#cgo LDFLAGS: -L/usr/local/cuda/lib64 -L${SRCDIR}/../nocuda -lcudart_static -ldl -lrt -lpthread -lm
*/
import "C"
