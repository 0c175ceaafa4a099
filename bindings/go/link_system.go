//go:build kvx_system

// go build -tags kvx_system: an installed kvx (cmake --install), found by
// pkg-config (PKG_CONFIG_PATH=PREFIX/lib/pkgconfig when the prefix is not
// on pkg-config's default path). kvx.h comes from the prefix and libkvx.so
// is linked dynamically: the binary finds it at run time through an rpath
// (CGO_LDFLAGS=-Wl,-rpath,PREFIX/lib) or LD_LIBRARY_PATH. See README.md.

package kvx

/*
#cgo pkg-config: kvx
*/
import "C"
