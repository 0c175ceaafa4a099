// Package transfer is kvx's tl.kv.v1 service over gRPC: a Server (the
// decode side's receiver, around an open writer kvx.Store) and a Client
// (the prefill side's sender), which an engine embeds; cmd/kvxd is the
// daemon built from them. The protocol is proto/tl/kv/v1/kv.proto and
// docs/TRANSFER.md.
//
// The Go side never re-implements a check: every chunk goes through
// kvx_xfer_stream_chunk (the C core, transfer/ in the library), every
// HasBlocks through kvx_xfer_has_blocks, and a failure answers with the
// gRPC status kvx_xfer_grpc_code gives its code and the library's message,
// which names the block. What Go adds: the lease table (random ids, a ttl,
// a timer that destroys the C lease), the stream and byte limits, the
// sink, the metrics, and the order of things on shutdown.
package transfer

import (
	"container/list"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"math"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	kvx "kvx.dev/kvx"
	"kvx.dev/transfer/tlkvpb"
)

// MaxPayload is the largest KvChunk.payload (KVX_XFER_MAX_PAYLOAD).
const MaxPayload = 4 << 20

// MaxRecvMsgSize is the gRPC receive limit a receiver needs: a payload
// over MaxPayload must reach the handler (DATA_LOSS), not be cut by gRPC
// (RESOURCE_EXHAUSTED) first.
const MaxRecvMsgSize = MaxPayload + 64<<10

// ServerOptions are GRPCServerOptions' companions: see NewServer.
type ServerOptions struct {
	LeaseTTL       time.Duration // a lease lapses this long after HasBlocks; 0 = 30s; whole ms, 1ms..2^32-1 ms (clamped)
	MaxStreams     int           // PushKv streams at once; more: RESOURCE_EXHAUSTED; 0 = 64
	MaxStreamBytes uint64        // payload bytes of one stream; more: RESOURCE_EXHAUSTED; 0 = no limit
	// StreamIdle cuts a PushKv stream (DEADLINE_EXCEEDED, nothing of it
	// published) that brought no whole chunk for this long, so streams
	// opened and left idle, or trickling bytes, cannot hold the
	// MaxStreams slots for good; 0 = 30s
	StreamIdle time.Duration
	// MaxLeases caps the live leases; a HasBlocks past it releases the
	// oldest lease first (its push still works: a block gone answers
	// ABORTED); 0 = 4096
	MaxLeases int
	// MaxHasBlocks caps the HasBlocks calls in flight across every
	// connection; gRPC reads a unary request (up to MaxRecvMsgSize) into
	// memory before the handler runs, so only a cap checked as the call
	// opens (Server.InTapHandle) bounds that memory. A call past it is
	// refused before its request is read (REFUSED_STREAM: the client sees
	// UNAVAILABLE), and a call must bring its request and be answered
	// within StreamIdle (4 MiB in 30 s: about 1.1 Mbit/s), so a silent
	// one frees its slot; 0 = 8
	MaxHasBlocks int
	// MaxHeaderListBytes caps a call's HTTP/2 header list, as decoded
	// (grpc.MaxHeaderListSize, advertised in SETTINGS): a call past it is
	// reset (RST_STREAM) before its handler or the HasBlocks tap runs, and
	// gRPC stops storing its headers at the cap. gRPC's own default, 16 MiB,
	// lets a client pin about 12 MiB of decoded metadata per call with a few
	// KB of HPACK-indexed wire; 0 = 16 KiB (a tl.kv.v1 call sends well
	// under 1 KiB)
	MaxHeaderListBytes uint32
	// MaxConnStreams caps the calls open at once on one connection
	// (grpc.MaxConcurrentStreams, advertised in SETTINGS: gRPC clients
	// queue past it, a stream over it is refused); 0 = MaxStreams +
	// MaxHasBlocks + 8
	MaxConnStreams uint32
	// ConnIdle closes a connection with no call open for this long
	// (keepalive.ServerParameters.MaxConnectionIdle: a GOAWAY, then the
	// close once the client acknowledges it, or a minute after; gRPC
	// clients reconnect on their next call). Without it, connections that
	// open no call are kept for good; 0 = 60s
	ConnIdle time.Duration
	// HandshakeTimeout bounds a new connection's TLS handshake and HTTP/2
	// preface (grpc.ConnectionTimeout, 120 s by default in gRPC); 0 = 10s
	HandshakeTimeout time.Duration
	Sink             Sink     // nil = none
	Metrics          *Metrics // nil = none
}

// Block is one accepted chunk as a Sink sees it.
type Block struct {
	BlockInfo
	KvFormat uint32   // the envelope version
	Payload  []byte   // the envelope (nil when Referenced); the sink may keep it
	Tokens   []uint32 // the block's token ids; the sink may keep them
}

// Sink sees every block a PushKv stream accepted, in order, the partial
// tail included (which the store never keeps: a decode engine takes it
// from here). It runs on the stream's goroutine before the next chunk is
// read; an error fails the stream (nothing of it is published) with the
// error's gRPC status, INTERNAL when it has none. Blocks of a stream that
// later fails were seen too: act on them after the push is answered
// (Done), not before.
type Sink interface {
	Block(ctx context.Context, b Block) error
	// Done: the stream ended; err nil means its blocks are durable and
	// were acknowledged.
	Done(ctx context.Context, r Result, err error)
}

// Server is the tl.kv.v1 receiver over an open writer store. Register it
// on a grpc.Server built with its GRPCOptions; Close it before closing
// the store.
type Server struct {
	tlkvpb.UnimplementedKvTransferServer
	store  *kvx.Store
	opts   ServerOptions
	sem    chan struct{}
	hasSem chan struct{} // HasBlocks calls in flight (InTapHandle)

	mu      sync.Mutex
	leases  map[string]*lease
	order   *list.List // of lease ids, oldest first
	closed  bool
	streams sync.WaitGroup
}

type lease struct {
	c     cLease
	timer *time.Timer
	el    *list.Element // in Server.order
}

// NewServer serves store (opened read-write: it keeps the writer lock).
func NewServer(store *kvx.Store, opts ServerOptions) *Server {
	if opts.LeaseTTL <= 0 {
		opts.LeaseTTL = 30 * time.Second
	}
	// HasBlocks answers the TTL as a uint32 of milliseconds: the lease
	// lasts exactly what it answers (whole ms, 1 .. 2^32-1), never a
	// wrapped or rounded-up figure.
	opts.LeaseTTL = opts.LeaseTTL.Truncate(time.Millisecond)
	if opts.LeaseTTL < time.Millisecond {
		opts.LeaseTTL = time.Millisecond
	}
	if max := time.Duration(math.MaxUint32) * time.Millisecond; opts.LeaseTTL > max {
		opts.LeaseTTL = max
	}
	if opts.MaxStreams <= 0 {
		opts.MaxStreams = 64
	}
	if opts.StreamIdle <= 0 {
		opts.StreamIdle = 30 * time.Second
	}
	if opts.MaxLeases <= 0 {
		opts.MaxLeases = 4096
	}
	if opts.MaxHasBlocks <= 0 {
		opts.MaxHasBlocks = 8
	}
	if opts.MaxHeaderListBytes == 0 {
		opts.MaxHeaderListBytes = DefaultMaxHeaderListBytes
	}
	if opts.MaxConnStreams == 0 {
		n := int64(opts.MaxStreams) + int64(opts.MaxHasBlocks) + 8
		if n > math.MaxUint32 {
			n = math.MaxUint32 // a sum that would wrap: no cap rather than a tiny one
		}
		opts.MaxConnStreams = uint32(n)
	}
	if opts.ConnIdle <= 0 {
		opts.ConnIdle = DefaultConnIdle
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = DefaultHandshakeTimeout
	}
	return &Server{store: store, opts: opts, sem: make(chan struct{}, opts.MaxStreams),
		hasSem: make(chan struct{}, opts.MaxHasBlocks), leases: map[string]*lease{}, order: list.New()}
}

// The defaults of ServerOptions' connection bounds (kvxd's flags).
const (
	DefaultMaxHeaderListBytes = 16 << 10
	DefaultConnIdle           = 60 * time.Second
	DefaultHandshakeTimeout   = 10 * time.Second
)

// GRPCServerOptions are the options any grpc.Server serving tl.kv.v1
// needs (the receive limit); add credentials and the like after them.
// A Server's own GRPCOptions add its HasBlocks cap and the connection
// bounds: use those for a server facing untrusted clients.
func GRPCServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxRecvMsgSize)}
}

// GRPCOptions are GRPCServerOptions plus s's HasBlocks cap
// (ServerOptions.MaxHasBlocks): InTapHandle checks it as each call opens,
// UnaryInterceptor releases it as the handler returns; one grpc.Server
// per Server. An embedder with a tap of its own calls s.InTapHandle from
// it (gRPC takes one tap). grpc.Server.ServeHTTP runs no tap: served that
// way, the cap does not hold. They also bound each connection
// (ServerOptions.MaxHeaderListBytes, MaxConnStreams, ConnIdle,
// HandshakeTimeout); an option given after them overrides theirs.
func (s *Server) GRPCOptions() []grpc.ServerOption {
	return append(GRPCServerOptions(), grpc.InTapHandle(s.InTapHandle),
		grpc.ChainUnaryInterceptor(s.UnaryInterceptor),
		grpc.MaxHeaderListSize(s.opts.MaxHeaderListBytes),
		grpc.MaxConcurrentStreams(s.opts.MaxConnStreams),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: s.opts.ConnIdle}),
		grpc.ConnectionTimeout(s.opts.HandshakeTimeout))
}

// hasBlocksMethod is HasBlocks's method name as gRPC routes it: with one
// leading '/' stripped (grpc.Server.handleStream), so a :path of
// "tl.kv.v1.KvTransfer/HasBlocks" reaches HasBlocks as well.
const hasBlocksMethod = "tl.kv.v1.KvTransfer/HasBlocks"

// hasBlocksSlot is one of MaxHasBlocks, held by a call from its tap on.
type hasBlocksSlot struct {
	once sync.Once
	sem  chan struct{}
}

// release frees the slot once. It must not cancel the call's context:
// that is also the stream's, and the answer is still to be written.
func (h *hasBlocksSlot) release() { h.once.Do(func() { <-h.sem }) }

type hasBlocksSlotKey struct{}

// InTapHandle is the HasBlocks cap, for grpc.InTapHandle (GRPCOptions
// installs it). It runs on the connection's reader as a call opens,
// before its request is read, and refuses a call past MaxHasBlocks in
// flight (it must not block: the reader also carries the calls in
// flight). A HasBlocks is recognized as gRPC routes it (with or without
// the leading '/'), so no spelling of the path slips past the cap; other
// calls, an embedder's own services included, are not counted. The slot is freed as the handler returns (UnaryInterceptor,
// so a client calling again right after its answer finds it free) or,
// failing that, when gRPC cancels the call's context, which it does as
// every call ends, however it ends (the request never read, the
// transport refusing the stream after the tap, the connection lost).
// StreamIdle bounds the whole call, request upload included, so a
// client that opens calls and never sends their requests cannot hold the
// slots for good.
func (s *Server) InTapHandle(ctx context.Context, info *tap.Info) (context.Context, error) {
	if strings.TrimPrefix(info.FullMethodName, "/") != hasBlocksMethod {
		return ctx, nil
	}
	select {
	case s.hasSem <- struct{}{}:
	default:
		err := status.Errorf(codes.Unavailable, "kvxd: %d HasBlocks already in flight (--max-has-blocks)",
			s.opts.MaxHasBlocks)
		s.opts.Metrics.call("HasBlocks", err) // the client sees UNAVAILABLE (a refused stream)
		return nil, err
	}
	bounded, cancel := context.WithTimeout(ctx, s.opts.StreamIdle)
	slot := &hasBlocksSlot{sem: s.hasSem}
	go func() {
		<-ctx.Done()
		cancel()
		slot.release()
	}()
	return context.WithValue(bounded, hasBlocksSlotKey{}, slot), nil
}

// UnaryInterceptor frees the call's HasBlocks slot (InTapHandle) as its
// handler returns, before the answer is written; GRPCOptions chains it.
func (s *Server) UnaryInterceptor(ctx context.Context, req interface{}, info *grpc.UnaryServerInfo,
	handler grpc.UnaryHandler) (interface{}, error) {
	if slot, ok := ctx.Value(hasBlocksSlotKey{}).(*hasBlocksSlot); ok {
		defer slot.release()
	}
	return handler(ctx, req)
}

// Close refuses new calls (UNAVAILABLE), waits for the PushKv streams in
// flight (stop or cancel the grpc.Server first so they end) and destroys
// every lease. Idempotent. Close the store after it.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.streams.Wait()
	s.mu.Lock()
	for id, l := range s.leases {
		l.timer.Stop()
		destroyLease(s.store, l.c)
		delete(s.leases, id)
	}
	s.order.Init()
	s.mu.Unlock()
	s.opts.Metrics.leases(0)
}

// Leases is the number of live leases (tests, metrics).
func (s *Server) Leases() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.leases)
}

func (s *Server) begin() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.streams.Add(1)
	return true
}

// HasBlocks answers which blocks are held and pins them under a lease.
func (s *Server) HasBlocks(ctx context.Context, req *tlkvpb.HasBlocksRequest) (resp *tlkvpb.HasBlocksResponse, err error) {
	defer func() { s.opts.Metrics.call("HasBlocks", err) }()
	if !s.begin() {
		return nil, status.Error(codes.Unavailable, "kvxd is shutting down")
	}
	defer s.streams.Done()
	held, cl, err := hasBlocks(s.store, req.BlockHashes, req.Tokens, req.BlockTokens, req.ModelSignature)
	if err != nil {
		return nil, toStatus(err)
	}
	resp = &tlkvpb.HasBlocksResponse{Held: held, LeaseTtlMs: uint32(s.opts.LeaseTTL / time.Millisecond)}
	any := false
	for _, h := range held {
		any = any || h
	}
	if cl == nil {
		return resp, nil
	}
	if !any { // nothing pinned: no lease to keep
		destroyLease(s.store, cl)
		return resp, nil
	}
	id := newLeaseID()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		destroyLease(s.store, cl)
		return nil, status.Error(codes.Unavailable, "kvxd is shutting down")
	}
	for len(s.leases) >= s.opts.MaxLeases { // the oldest goes first
		s.drop(s.order.Front().Value.(string))
	}
	s.leases[id] = &lease{c: cl, timer: time.AfterFunc(s.opts.LeaseTTL, func() { s.release(id) }),
		el: s.order.PushBack(id)}
	n := len(s.leases)
	s.mu.Unlock()
	s.opts.Metrics.leases(n)
	resp.LeaseId = id
	return resp, nil
}

// release destroys lease id (its ttl passed, or the push naming it ended).
func (s *Server) release(id string) {
	if id == "" {
		return
	}
	s.mu.Lock()
	s.drop(id)
	n := len(s.leases)
	s.mu.Unlock()
	s.opts.Metrics.leases(n)
}

// drop destroys lease id if it is live. Under mu.
func (s *Server) drop(id string) {
	if l := s.leases[id]; l != nil {
		delete(s.leases, id)
		s.order.Remove(l.el)
		l.timer.Stop()
		destroyLease(s.store, l.c)
	}
}

func newLeaseID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("kvx transfer: crypto/rand: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// PushKv receives one prompt's blocks through one kvx_xfer_stream and
// answers once they are durable; any failure destroys the stream (nothing
// of it is published).
func (s *Server) PushKv(stream tlkvpb.KvTransfer_PushKvServer) (err error) {
	defer func() { s.opts.Metrics.call("PushKv", err) }()
	if !s.begin() {
		return status.Error(codes.Unavailable, "kvxd is shutting down")
	}
	defer s.streams.Done()
	select {
	case s.sem <- struct{}{}:
		defer func() { <-s.sem }()
	default:
		return status.Errorf(codes.ResourceExhausted, "kvxd: %d PushKv streams already in flight (--max-streams)", s.opts.MaxStreams)
	}
	s.opts.Metrics.stream(1)
	defer s.opts.Metrics.stream(-1)
	ctx := stream.Context()
	r, err := s.receive(ctx, stream)
	if s.opts.Sink != nil {
		s.opts.Sink.Done(ctx, r, err)
	}
	if err != nil {
		return err
	}
	s.opts.Metrics.pushed(r)
	return stream.SendAndClose(&tlkvpb.PushKvResponse{BlocksStored: r.BlocksStored, BlocksReferenced: r.BlocksReferenced,
		BytesReceived: r.BytesReceived, Durable: r.Durable, TailTokens: r.TailTokens})
}

type chunkReceiver interface {
	Recv() (*tlkvpb.KvChunk, error)
}

// readAheadChunks chunks are received ahead of the one being applied.
const readAheadChunks = 3

type received struct {
	ch  *tlkvpb.KvChunk
	err error
}

// readAhead receives on one goroutine (the only caller of Recv) into a
// channel of depth chunks, ending after the first error (io.EOF included).
// stop releases it when the consumer ends early; a Recv still blocked then
// returns once gRPC cancels the finished RPC.
func readAhead(stream chunkReceiver, depth int) (<-chan received, func()) {
	out := make(chan received, depth)
	done := make(chan struct{})
	go func() {
		for {
			ch, err := stream.Recv()
			select {
			case out <- received{ch, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	var once sync.Once
	return out, func() { once.Do(func() { close(done) }) }
}

func (s *Server) receive(ctx context.Context, stream chunkReceiver) (Result, error) {
	cs, err := newCStream(s.store)
	if err != nil {
		return Result{}, toStatus(err)
	}
	defer cs.destroy() // after finish it only frees; before, it drops the stream's blocks
	var leaseID string
	defer func() { s.release(leaseID) }()
	var total uint64
	// the next chunks arrive while this one is checked and written: the
	// C call and the network overlap (a few chunks of at most 4 MiB each)
	next, stop := readAhead(stream, readAheadChunks)
	defer stop()
	// the idle clock runs only while waiting for a chunk (not while one is
	// written or seen by the sink), and a chunk already read wins
	idle := time.NewTimer(s.opts.StreamIdle)
	idle.Stop()
	for {
		var rc received
		select {
		case rc = <-next:
		default:
			idle.Reset(s.opts.StreamIdle)
			select {
			case rc = <-next:
			case <-idle.C:
				return cs.progress(), status.Errorf(codes.DeadlineExceeded,
					"kvxd: no chunk for %v (--stream-idle): the stream is cut", s.opts.StreamIdle)
			}
			if !idle.Stop() {
				select { // it fired as the chunk came
				case <-idle.C:
				default:
				}
			}
		}
		ch, err := rc.ch, rc.err
		if err == io.EOF {
			break
		}
		if err != nil {
			if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
				return cs.progress(), st.Err()
			}
			return cs.progress(), status.Error(codes.Canceled, "kvxd: the stream was cut: "+err.Error())
		}
		if leaseID == "" {
			leaseID = ch.LeaseId
		}
		total += uint64(len(ch.Payload))
		if s.opts.MaxStreamBytes > 0 && total > s.opts.MaxStreamBytes {
			return cs.progress(), status.Errorf(codes.ResourceExhausted,
				"kvxd: the stream's payloads passed %d bytes (--max-stream-bytes)", s.opts.MaxStreamBytes)
		}
		k := Chunk{KvFormat: ch.KvFormat, BlockHash: ch.BlockHash, Payload: ch.Payload, CRC32C: ch.Crc32C,
			Tokens: ch.Tokens, ModelSignature: ch.ModelSignature}
		info, err := cs.chunk(&k)
		if err != nil {
			return cs.progress(), toStatus(err)
		}
		if s.opts.Sink != nil {
			b := Block{BlockInfo: info, KvFormat: ch.KvFormat, Tokens: ch.Tokens}
			if !info.Referenced {
				b.Payload = ch.Payload
			}
			if err := s.opts.Sink.Block(ctx, b); err != nil {
				if _, ok := status.FromError(err); !ok {
					err = status.Error(codes.Internal, "kvxd: sink: "+err.Error())
				}
				return cs.progress(), err
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return cs.progress(), status.FromContextError(err).Err()
	}
	r, err := cs.finish()
	if err != nil {
		return r, toStatus(err)
	}
	return r, nil
}

// toStatus is the gRPC status of a transfer error.
func toStatus(err error) error {
	var e *Error
	if errors.As(err, &e) {
		return status.Error(e.GRPC, e.Message)
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Internal, err.Error())
}
