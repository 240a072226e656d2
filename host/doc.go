// Package host is the server side of the flashgate process, owned by no
// front-end: the gRPC server with its options, limits and optional TLS
// (Options.TLS, e.g. a tlsreload.Reloader's ServerConfig), gRPC health and
// reflection for every service on it, the HTTP server of /metrics,
// /healthz and /readyz (and /debug/pprof/), the HTTP server of an HTTP
// front-end (HTTP/1.1 and h2c) and of ratelimit's HTTP side (/json), the
// listeners' connection caps (the gRPC one's handshakes apart), their
// metrics and error log, and the graceful stop.
//
//	grpcLis, err := host.Listen(addr)              // "host:port" or "unix:///path"
//	h, err := host.New(host.Options{GRPC: grpcLis, HTTP: httpLis, Registry: reg, Codec: srv.Codec(),
//	        HTTPAuthz: authzLis, HTTPAuthzHandler: httpFront})   // optional: an HTTP front-end's listener
//	srv.Register(h)                                // each front-end registers its service
//	go h.Serve(ctx)                                // until ctx ends or a listener fails
//	h.SetServing(true)                             // health "" and every service; /readyz
//	h.Shutdown(drainCtx)                           // NOT_SERVING, GracefulStop (and the HTTP front-end's), hard Stop at ctx's end
//
// Front-ends never import it: they register on a grpc.ServiceRegistrar, or
// are an http.Handler.
package host
