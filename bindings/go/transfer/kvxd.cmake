# kvxd.cmake - kvxd, the tl.kv.v1 daemon (bindings/go/transfer/cmd/kvxd),
# built into the build directory (BUILD/kvxd, part of ALL) and installed
# into bin/ (target kvxd_go), whenever go and Debian's gRPC, protobuf and client_golang
# sources (/usr/share/gocode) are there; skipped with a note otherwise, and
# in sanitizer and fuzzer builds (a Go binary cannot link their libkvx.a).
# scripts/vendor-go.sh vendors those sources into the module first, so the
# Go build needs no network (GOPROXY=off). Tests (KVX_BUILD_TESTS): ctest
# go_transfer (go vet, go test) and go_transfer_race (go test -race) run the
# module's tests against this build's libkvx.a, kvxd and kvx.
# Included from the top-level CMakeLists.txt.

set(KVX_GOCODE /usr/share/gocode/src CACHE PATH "Debian's Go sources (grpc-go, protobuf, client_golang)")
find_program(KVX_GO go)
set(kvxd_missing "")
if(NOT KVX_GO)
  set(kvxd_missing "go")
endif()
foreach(d google.golang.org/grpc google.golang.org/protobuf github.com/golang/protobuf/proto
          github.com/prometheus/client_golang/prometheus)
  if(NOT EXISTS ${KVX_GOCODE}/${d})
    string(APPEND kvxd_missing " ${KVX_GOCODE}/${d}")
  endif()
endforeach()
if(EXISTS ${KVX_GOCODE}/github.com/golang/protobuf/go.mod)
  file(READ ${KVX_GOCODE}/github.com/golang/protobuf/go.mod kvxd_gpb)
  if(NOT kvxd_gpb MATCHES "google.golang.org/protobuf")
    string(APPEND kvxd_missing " golang-github-golang-protobuf-1-5-dev (1.3 is installed)")
  endif()
endif()
if(KVX_SANITIZE OR KVX_BUILD_FUZZERS)
  message(STATUS "kvxd: not built in a sanitizer or fuzzer build")
elseif(NOT kvxd_missing STREQUAL "")
  message(STATUS "kvxd: not built (missing:${kvxd_missing}; scripts/install-deps.sh installs them)")
else()
  set(kvxd_dir ${PROJECT_SOURCE_DIR}/bindings/go/transfer)
  file(GLOB_RECURSE kvxd_sources CONFIGURE_DEPENDS
    ${kvxd_dir}/*.go ${PROJECT_SOURCE_DIR}/bindings/go/*.go ${PROJECT_SOURCE_DIR}/bindings/go/shim.c
    ${PROJECT_SOURCE_DIR}/bindings/go/shim.h)
  list(FILTER kvxd_sources EXCLUDE REGEX "/vendor/|_test\\.go$")
  set(kvxd_env ${CMAKE_COMMAND} -E env GOPROXY=off GOFLAGS=-mod=vendor\ -buildvcs=false
    CGO_LDFLAGS=-L${PROJECT_BINARY_DIR})
  add_custom_command(OUTPUT ${PROJECT_BINARY_DIR}/kvxd
    COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/vendor-go.sh --quiet
    # go's build cache does not hash libkvx.a (cgo links it by -lkvx), so
    # a changed library would leave a stale kvxd: the library's hash in the
    # link flags (an -X of a variable that need not exist) forces a relink
    COMMAND sh -c "exec \"$0\" \"$@\" -ldflags=-X=main.libkvxHash=$(sha256sum \"${PROJECT_BINARY_DIR}/libkvx.a\" | cut -c1-16) -o \"${PROJECT_BINARY_DIR}/kvxd\" ./cmd/kvxd"
      ${CMAKE_COMMAND} -E env GOPROXY=off GOFLAGS=-mod=vendor\ -buildvcs=false CGO_LDFLAGS=-L${PROJECT_BINARY_DIR}
      ${KVX_GO} build
    WORKING_DIRECTORY ${kvxd_dir}
    DEPENDS kvx_static ${kvxd_sources} ${kvxd_dir}/go.mod ${PROJECT_SOURCE_DIR}/scripts/vendor-go.sh
    COMMENT "Building kvxd (Go, vendored Debian gRPC)"
    VERBATIM)
  add_custom_target(kvxd_go ALL DEPENDS ${PROJECT_BINARY_DIR}/kvxd)
  install(PROGRAMS ${PROJECT_BINARY_DIR}/kvxd DESTINATION ${CMAKE_INSTALL_BINDIR})
  if(KVX_BUILD_TESTS)
    # the test binaries link libkvx.a too: its hash in -ldflags, as above
    set(kvxd_stamp "-ldflags=-X=main.libkvxHash=$(sha256sum \"${PROJECT_BINARY_DIR}/libkvx.a\" | cut -c1-16)")
    add_test(NAME go_transfer COMMAND sh -c "\"$0\" \"$@\" vet ./... && \"$0\" \"$@\" test -count=1 ${kvxd_stamp} ./..."
      ${KVX_GO} WORKING_DIRECTORY ${kvxd_dir})
    add_test(NAME go_transfer_race COMMAND sh -c "\"$0\" test -count=1 -race ${kvxd_stamp} ./..."
      ${KVX_GO} WORKING_DIRECTORY ${kvxd_dir})
    foreach(t go_transfer go_transfer_race)
      set_tests_properties(${t} PROPERTIES TIMEOUT 900 RESOURCE_LOCK kvx_go_transfer
        ENVIRONMENT "GOPROXY=off;GOFLAGS=-mod=vendor -buildvcs=false;CGO_LDFLAGS=-L${PROJECT_BINARY_DIR};KVXD=${PROJECT_BINARY_DIR}/kvxd;KVX_CLI=$<TARGET_FILE:kvx_cli>")
    endforeach()
  endif()
endif()
