package enforce

import (
	"net/http"
	"strconv"
	"strings"
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
