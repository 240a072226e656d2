// Package host is the server side of the flashgate process, owned by no
// front-end: the gRPC server with its limits and optional TLS, gRPC health
// and reflection for every service on it, the HTTP server of /metrics,
// /healthz and /readyz, the HTTP servers of the HTTP front-ends, each
// listener's connection cap and metrics, and the graceful stop.
// Front-ends never import it: they register on a grpc.ServiceRegistrar, or
// are an http.Handler.
//
//	h, err := host.New(host.Options{GRPC: grpcLis, HTTP: httpLis, Registry: reg, Codec: srv.Codec()})
//	srv.Register(h)
//	go h.Serve(ctx)
//	h.SetServing(true)
//	h.Shutdown(drainCtx)
package host
