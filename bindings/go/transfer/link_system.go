//go:build kvx_system

// go build -tags kvx_system: an installed kvx found by pkg-config, as the
// core package's ../link_system.go.

package transfer

/*
#cgo pkg-config: kvx
*/
import "C"
