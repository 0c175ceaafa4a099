// metrics.go - Prometheus counters of a Server (kvxd --metrics).

package transfer

import (
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/status"
)

// Metrics are a Server's Prometheus collectors. A nil *Metrics records
// nothing.
type Metrics struct {
	calls            *prometheus.CounterVec
	pushes           prometheus.Counter
	blocksStored     prometheus.Counter
	blocksReferenced prometheus.Counter
	bytesReceived    prometheus.Counter
	tailTokens       prometheus.Counter
	streamsActive    prometheus.Gauge
	leasesActive     prometheus.Gauge
	connsOpen        prometheus.Gauge
}

// NewMetrics registers the collectors on reg:
//
//	kvx_transfer_calls_total{rpc="HasBlocks"|"PushKv",code="OK"|"DATA_LOSS"|...}
//	kvx_transfer_pushes_total              pushes acknowledged (durable)
//	kvx_transfer_blocks_stored_total       full blocks newly written
//	kvx_transfer_blocks_referenced_total   full blocks sent empty, found held
//	kvx_transfer_bytes_received_total      payload bytes of acknowledged pushes
//	kvx_transfer_tail_tokens_total         tail tokens of acknowledged pushes
//	kvx_transfer_streams_active            PushKv streams in flight
//	kvx_transfer_leases_active             leases not yet released
//	kvx_transfer_connections_open          connections open (LimitListener)
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvx", Subsystem: "transfer", Name: name, Help: help})
	}
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kvx", Subsystem: "transfer", Name: name, Help: help})
	}
	m := &Metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvx", Subsystem: "transfer",
			Name: "calls_total", Help: "tl.kv.v1 calls answered, by RPC and gRPC status code."}, []string{"rpc", "code"}),
		pushes:           c("pushes_total", "PushKv streams acknowledged (their full blocks durable)."),
		blocksStored:     c("blocks_stored_total", "Full blocks newly written by acknowledged pushes."),
		blocksReferenced: c("blocks_referenced_total", "Full blocks sent with an empty payload and found held."),
		bytesReceived:    c("bytes_received_total", "Payload (envelope) bytes of acknowledged pushes."),
		tailTokens:       c("tail_tokens_total", "Partial-tail tokens of acknowledged pushes."),
		streamsActive:    g("streams_active", "PushKv streams in flight."),
		leasesActive:     g("leases_active", "HasBlocks leases not yet released."),
		connsOpen:        g("connections_open", "Connections accepted and not yet closed (LimitListener, --max-conns)."),
	}
	for _, col := range []prometheus.Collector{m.calls, m.pushes, m.blocksStored, m.blocksReferenced,
		m.bytesReceived, m.tailTokens, m.streamsActive, m.leasesActive, m.connsOpen} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func codeName(err error) string {
	s := status.Code(err).String() // "OK", "DataLoss", ...
	return map[string]string{"OK": "OK", "Canceled": "CANCELLED", "Unknown": "UNKNOWN",
		"InvalidArgument": "INVALID_ARGUMENT", "DeadlineExceeded": "DEADLINE_EXCEEDED", "NotFound": "NOT_FOUND",
		"AlreadyExists": "ALREADY_EXISTS", "PermissionDenied": "PERMISSION_DENIED",
		"ResourceExhausted": "RESOURCE_EXHAUSTED", "FailedPrecondition": "FAILED_PRECONDITION",
		"Aborted": "ABORTED", "OutOfRange": "OUT_OF_RANGE", "Unimplemented": "UNIMPLEMENTED",
		"Internal": "INTERNAL", "Unavailable": "UNAVAILABLE", "DataLoss": "DATA_LOSS",
		"Unauthenticated": "UNAUTHENTICATED"}[s]
}

func (m *Metrics) call(rpc string, err error) {
	if m != nil {
		m.calls.WithLabelValues(rpc, codeName(err)).Inc()
	}
}

func (m *Metrics) pushed(r Result) {
	if m != nil {
		m.pushes.Inc()
		m.blocksStored.Add(float64(r.BlocksStored))
		m.blocksReferenced.Add(float64(r.BlocksReferenced))
		m.bytesReceived.Add(float64(r.BytesReceived))
		m.tailTokens.Add(float64(r.TailTokens))
	}
}

func (m *Metrics) stream(d int) {
	if m != nil {
		m.streamsActive.Add(float64(d))
	}
}

func (m *Metrics) leases(n int) {
	if m != nil {
		m.leasesActive.Set(float64(n))
	}
}

func (m *Metrics) conns(d int) {
	if m != nil {
		m.connsOpen.Add(float64(d))
	}
}
