package xds

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/flashgate/flashgate/rls"
)

// Defaults, as ratelimit's settings.
const (
	// DefaultNodeID is ratelimit's CONFIG_GRPC_XDS_NODE_ID default.
	DefaultNodeID = "default"
	// DefaultRetryInterval is ratelimit's
	// CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL default.
	DefaultRetryInterval = 3 * time.Second
)

// minConnectTimeout bounds one connection attempt (gRPC's default).
const minConnectTimeout = 20 * time.Second

// maxErrorDetail bounds the error message a NACK carries.
const maxErrorDetail = 4096

// Applier installs a whole config; on an error the config in force stays.
type Applier interface {
	Push(files []rls.File) error
}

// Options configure a Client.
type Options struct {
	// Server is the management server's address, HOST:PORT (required).
	Server string
	// NodeID is the node's id (DefaultNodeID if "").
	NodeID string
	// NodeMetadata is the node's metadata, string fields.
	NodeMetadata map[string]string
	// RetryInterval is the pause before a new stream (default if 0).
	RetryInterval time.Duration
	// TLS, when not nil, secures the connection.
	TLS *tls.Config
	// Apply installs each response's config (required).
	Apply Applier
	// Logger logs stream failures and refused configs (slog.Default if nil).
	Logger *slog.Logger
}

// Client is a state-of-the-world xDS client of ratelimit configs (see the
// package doc). Build it with [New] and run it with [Client.Run].
type Client struct {
	opts  Options
	node  *corev3.Node
	first chan struct{} // closed once a config was applied
	once  sync.Once
}

// New returns a Client of o, or a plain-sentence error when o is
// incomplete.
func New(o Options) (*Client, error) {
	if o.Server == "" {
		return nil, errors.New("xds: no management server address given")
	}
	if o.Apply == nil {
		return nil, errors.New("xds: no applier given")
	}
	if o.RetryInterval < 0 {
		return nil, errors.New("xds: the retry interval must not be negative")
	}
	if o.NodeID == "" {
		o.NodeID = DefaultNodeID
	}
	if o.RetryInterval == 0 {
		o.RetryInterval = DefaultRetryInterval
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	md := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for k, v := range o.NodeMetadata {
		md.Fields[k] = structpb.NewStringValue(v)
	}
	return &Client{opts: o, node: &corev3.Node{Id: o.NodeID, Metadata: md}, first: make(chan struct{})}, nil
}

// ParseMetadata reads "k1=v1,k2=v2" as ratelimit's
// CONFIG_GRPC_XDS_NODE_METADATA, skipping entries without "=".
func ParseMetadata(s string) map[string]string {
	md := map[string]string{}
	for _, e := range strings.Split(s, ",") {
		if k, v, ok := strings.Cut(e, "="); ok {
			md[k] = v
		}
	}
	return md
}

// Applied is closed once a first config was applied.
func (c *Client) Applied() <-chan struct{} { return c.first }

// Run applies what the management server pushes until ctx ends, then
// returns nil. Stream failures are logged and retried; only a connection
// that cannot be set up at all is returned.
func (c *Client) Run(ctx context.Context) error {
	creds := insecure.NewCredentials()
	if c.opts.TLS != nil {
		creds = credentials.NewTLS(c.opts.TLS)
	}
	// Reconnect every retry interval, not on gRPC's backoff, which grows
	// to two minutes.
	conn, err := grpc.NewClient(c.opts.Server, grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: c.opts.RetryInterval, Multiplier: 1, Jitter: 0.2, MaxDelay: c.opts.RetryInterval},
			MinConnectTimeout: minConnectTimeout,
		}))
	if err != nil {
		return fmt.Errorf("xds: %w", err)
	}
	defer conn.Close()
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
	log := c.opts.Logger.With("xds_server", c.opts.Server)
	for {
		err := c.stream(ctx, ads, log)
		if ctx.Err() != nil {
			return nil
		}
		log.Error("xds stream failed; the ratelimit config in force stays, will retry",
			"retry_in", c.opts.RetryInterval.String(), "error", err)
		t := time.NewTimer(c.opts.RetryInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// stream runs one ADS stream until it fails or ctx ends, asking for every
// resource so a new stream resends the whole config.
func (c *Client) stream(ctx context.Context, ads discoveryv3.AggregatedDiscoveryServiceClient, log *slog.Logger) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	if err := st.Send(&discoveryv3.DiscoveryRequest{Node: c.node, TypeUrl: TypeURL}); err != nil {
		return err
	}
	log.Info("xds stream open; waiting for ratelimit configs", "node_id", c.node.GetId())
	acked := "" // the version last applied on this stream
	// refused and why are the version last refused and the reason: a
	// server resending it gets the same NACK after the retry interval,
	// without a new parse or log.
	var refused, why string
	for {
		resp, err := st.Recv()
		if err != nil {
			return err
		}
		req := &discoveryv3.DiscoveryRequest{Node: c.node, TypeUrl: TypeURL, ResponseNonce: resp.GetNonce()}
		if resp.GetTypeUrl() != TypeURL {
			// Not subscribed: refuse it, keep the version.
			req.VersionInfo = acked
			req.TypeUrl = resp.GetTypeUrl()
			req.ErrorDetail = &status.Status{Code: int32(codes.InvalidArgument), Message: "type not subscribed: want " + TypeURL}
		} else if v := resp.GetVersionInfo(); v != "" && v == refused {
			t := time.NewTimer(c.opts.RetryInterval)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
			req.VersionInfo = acked
			req.ErrorDetail = &status.Status{Code: int32(codes.InvalidArgument), Message: why}
		} else if err := c.apply(resp); err != nil {
			msg := err.Error()
			if len(msg) > maxErrorDetail {
				msg = msg[:maxErrorDetail]
			}
			log.Error("xds ratelimit config refused (NACK); the config in force stays",
				"version", bounded(resp.GetVersionInfo()), "error", err)
			req.VersionInfo = acked
			req.ErrorDetail = &status.Status{Code: int32(codes.InvalidArgument), Message: msg}
			refused, why = resp.GetVersionInfo(), msg
		} else {
			refused = ""
			acked = resp.GetVersionInfo()
			req.VersionInfo = acked
			log.Info("xds ratelimit config applied (ACK)", "version", bounded(acked), "resources", len(resp.GetResources()))
			c.once.Do(func() { close(c.first) })
		}
		if err := st.Send(req); err != nil {
			return err
		}
	}
}

// apply converts resp's resources and applies them.
func (c *Client) apply(resp *discoveryv3.DiscoveryResponse) error {
	files, err := Files(resp.GetResources())
	if err != nil {
		return err
	}
	return c.opts.Apply.Push(files)
}

// bounded cuts a server-chosen string for a log line.
func bounded(s string) string {
	if len(s) > maxNameLen {
		return s[:maxNameLen]
	}
	return s
}
