package enforce

import (
	"context"

	"github.com/flashgate/flashgate/window"
)

// DecideHits decides hits as Decide does once no rule refused the request.
func (f *Front) DecideHits(ctx context.Context, hits []window.Hit, p Policies) Outcome {
	return f.decideHits(ctx, hits, p)
}
