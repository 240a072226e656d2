package enforce

import (
	"context"
	"net/http"
	"strconv"
	"strings"

	"github.com/flashgate/flashgate/window"
)

// ProblemWithStatus returns body, a denial's problem, with its status
// member set to status and its title to that status's reason phrase (a
// front-end that answers a denial with another status than 429, e.g. 403
// for nginx's auth_request); a body that is not one of
// [Policy.AppendProblem]'s, or a status without a reason phrase, returns
// body as it is.
func ProblemWithStatus(body string, status int) string {
	rest, ok := strings.CutPrefix(body, problemHead+"429,")
	title := http.StatusText(status)
	if !ok || title == "" {
		return body
	}
	return problemType + strconv.Quote(title) + `,"status":` + strconv.Itoa(status) + "," + rest
}

// DecideHits decides hits as Decide does once no rule refused the request.
func (f *Front) DecideHits(ctx context.Context, hits []window.Hit, p Policies) Outcome {
	return f.decideHits(ctx, hits, p)
}
