package httpauthz

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

// Checker decides one check, as Envoy's ext_authz Check does;
// *extauthz.Server is one. It must be safe for concurrent use, and must
// not keep req once it has returned.
type Checker interface {
	Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error)
}

// Options configure a [Handler]. Only Checker is required.
type Options struct {
	// Checker decides the checks.
	Checker Checker
	// PathPrefix is Envoy http_service's path_prefix: stripped, at a "/"
	// boundary, from the path of a request that carries no original URI
	// header. "" (or "/") for none.
	PathPrefix string
	// Registerer takes flashgate_http_authz_rejected_total; nil registers
	// it nowhere.
	Registerer prometheus.Registerer
	// Logger logs Checker errors; nil discards them.
	Logger *slog.Logger
}

// Handler is the HTTP front-end: an http.Handler answering every request
// as a check (see the package comment). Build it with [New]; it is safe
// for concurrent use.
type Handler struct {
	checker  Checker
	prefix   string
	log      *slog.Logger
	rejected map[string]prometheus.Counter // by reason, every reason present
}

var _ http.Handler = (*Handler)(nil)

// New returns a Handler on opts. It fails without a Checker, for a
// PathPrefix that is not a path, and when its metric cannot be registered.
func New(opts Options) (*Handler, error) {
	if opts.Checker == nil {
		return nil, errors.New("httpauthz: no checker given")
	}
	prefix, err := NormalizePrefix(opts.PathPrefix)
	if err != nil {
		return nil, fmt.Errorf("httpauthz: path prefix %q: %w", opts.PathPrefix, err)
	}
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flashgate_http_authz_rejected_total",
		Help: "Requests to the HTTP front-end (--http-authz-addr) answered without a decision, by reason: bad_method, bad_uri, outside_prefix, headers_too_large (400), check_failed (503).",
	}, []string{"reason"})
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(vec); err != nil {
			return nil, fmt.Errorf("httpauthz: register metrics: %w", err)
		}
	}
	h := &Handler{checker: opts.Checker, prefix: prefix, log: opts.Logger, rejected: map[string]prometheus.Counter{}}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	for _, r := range reasons {
		h.rejected[r] = vec.WithLabelValues(r)
	}
	return h, nil
}

// ServeHTTP implements http.Handler: it checks the request r describes
// and answers the decision.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req, err := checkRequest(r, h.prefix)
	if err != nil {
		var rej *rejection
		if !errors.As(err, &rej) {
			rej = &rejection{ReasonBadURI, err.Error()}
		}
		h.rejected[rej.reason].Inc()
		plain(w, http.StatusBadRequest, rej.msg)
		return
	}
	resp, err := h.checker.Check(r.Context(), req)
	if err == nil && resp == nil {
		err = errors.New("the checker returned no response")
	}
	if err != nil {
		h.rejected[ReasonCheckFailed].Inc()
		if r.Context().Err() == nil {
			h.log.Warn("http_authz: check failed; answered 503", "error", err)
		}
		plain(w, http.StatusServiceUnavailable, errCheckFailedMsg)
		return
	}
	writeResponse(w, resp, denyStatus(r.Header))
}

// plain answers status with msg as its plain-text body.
func plain(w http.ResponseWriter, status int, msg string) {
	hd := w.Header()
	hd.Set("Content-Type", "text/plain; charset=utf-8")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Content-Length", strconv.Itoa(len(msg)+1))
	w.WriteHeader(status)
	_, _ = w.Write([]byte(msg + "\n"))
}

// denyStatus returns the status X-Flashgate-Deny-Status asks a denial to
// be answered with, 401 or 403, or 0 when it is absent or another value.
func denyStatus(h http.Header) int {
	vs := h[HeaderDenyStatus]
	if len(vs) == 0 {
		return 0
	}
	switch strings.TrimSpace(vs[0]) {
	case "401":
		return http.StatusUnauthorized
	case "403":
		return http.StatusForbidden
	}
	return 0
}

// writeResponse writes resp as HTTP: OK → 200 with the OK response's
// headers; anything else → the denied response (see the package comment),
// with status override (0: none).
func writeResponse(w http.ResponseWriter, resp *authv3.CheckResponse, override int) {
	hd := w.Header()
	if codes.Code(resp.GetStatus().GetCode()) == codes.OK {
		ok := resp.GetOkResponse()
		addHeaders(hd, ok.GetHeaders())
		addHeaders(hd, ok.GetResponseHeadersToAdd())
		hd["Content-Length"] = zeroLength
		w.WriteHeader(http.StatusOK)
		return
	}
	denied := resp.GetDeniedResponse()
	status := int(denied.GetStatus().GetCode())
	if status < 300 || status > 599 {
		status = http.StatusForbidden // Envoy's default; a 2xx would read as allowed
	}
	addHeaders(hd, denied.GetHeaders())
	body := denied.GetBody()
	if override != 0 {
		status = override
		if body != "" && isJSON(hd.Get("Content-Type")) {
			body = withStatusMember(body, status)
		}
	}
	hd.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	if body != "" {
		_, _ = w.Write([]byte(body))
	}
}

// zeroLength is the Content-Length of a body-less answer; shared, never
// modified.
var zeroLength = []string{"0"}

// addHeaders applies opts to h as Envoy applies them to a response, except
// the pseudo-headers and the headers of the message's framing, which the
// HTTP server writes itself.
func addHeaders(h http.Header, opts []*corev3.HeaderValueOption) {
	for _, o := range opts {
		hv := o.GetHeader()
		k := hv.GetKey()
		if k == "" || k[0] == ':' {
			continue
		}
		k = http.CanonicalHeaderKey(k)
		if framing(k) {
			continue
		}
		v := hv.GetValue()
		if v == "" && len(hv.GetRawValue()) > 0 {
			v = string(hv.GetRawValue())
		}
		_, exists := h[k]
		switch appendAction(o) {
		case corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD:
			h[k] = append(h[k], v)
		case corev3.HeaderValueOption_ADD_IF_ABSENT:
			if !exists {
				h[k] = []string{v}
			}
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
			if exists {
				h[k] = []string{v}
			}
		default: // OVERWRITE_IF_EXISTS_OR_ADD
			h[k] = []string{v}
		}
	}
}

// appendAction returns o's action, the deprecated append flag read as
// Envoy reads it when set.
func appendAction(o *corev3.HeaderValueOption) corev3.HeaderValueOption_HeaderAppendAction {
	if a := o.GetAppend(); a != nil {
		if a.GetValue() {
			return corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD
		}
		return corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
	}
	return o.GetAppendAction()
}

// framing reports whether the canonical header name k frames the message
// or the connection.
func framing(k string) bool {
	switch k {
	case "Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Upgrade":
		return true
	}
	return false
}

// isJSON reports whether the media type ct is JSON (application/json or a
// +json type such as application/problem+json).
func isJSON(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// withStatusMember returns the JSON object body with its top-level
// "status" member, when that is a number, set to status; body itself when
// it has none or is no JSON object. The rest of the body is kept byte for
// byte.
func withStatusMember(body string, status int) string {
	dec := json.NewDecoder(strings.NewReader(body))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return body
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return body
		}
		if key, _ := t.(string); key != "status" {
			var skip json.RawMessage
			if dec.Decode(&skip) != nil {
				return body
			}
			continue
		}
		after := int(dec.InputOffset())
		v, err := dec.Token()
		if err != nil {
			return body
		}
		if _, ok := v.(json.Number); !ok {
			return body
		}
		end := int(dec.InputOffset())
		start := after + strings.IndexFunc(body[after:end], func(c rune) bool {
			return c != ':' && c != ' ' && c != '\t' && c != '\n' && c != '\r'
		})
		if start < after {
			return body
		}
		return body[:start] + strconv.Itoa(status) + body[end:]
	}
	return body
}
