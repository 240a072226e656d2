package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/flashgate/flashgate/extauthz"
	"google.golang.org/grpc"
)

// serveGRPC serves s on lis until ctx is done, then stops it gracefully,
// forcing it after grace: in-flight calls get up to grace to finish.
func serveGRPC(ctx context.Context, s *grpc.Server, lis net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(lis) }()
	select {
	case err := <-errc:
		if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("grpc server on %s: %w", lis.Addr(), err)
		}
		return nil
	case <-ctx.Done():
	}
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	_ = extauthz.GracefulStop(gctx, s) // past grace the remaining calls are cut
	<-errc
	return nil
}
