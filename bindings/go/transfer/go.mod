module kvx.dev/transfer

go 1.19

// Debian's packages, vendored by scripts/vendor-go.sh (no network).
require (
	github.com/beorn7/perks v1.0.1
	github.com/cespare/xxhash/v2 v2.1.1
	github.com/golang/protobuf v1.5.2
	github.com/matttproud/golang_protobuf_extensions v0.0.0-00010101000000-000000000000
	github.com/prometheus/client_golang v1.14.0
	github.com/prometheus/client_model v0.3.0
	github.com/prometheus/common v0.39.0
	github.com/prometheus/procfs v0.8.0
	golang.org/x/net v0.7.0
	golang.org/x/sys v0.3.0
	golang.org/x/text v0.7.0
	google.golang.org/genproto v0.0.0-20200413000000-b5235f6
	google.golang.org/grpc v1.33.3
	google.golang.org/protobuf v1.28.1
	kvx.dev/kvx v0.0.0-00010101000000-000000000000
)

replace kvx.dev/kvx => ../
