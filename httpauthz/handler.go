package httpauthz

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/flashgate/flashgate/descriptors"
)

// Checker decides the request req describes and answers as Envoy's
// ext_authz Check does; *extauthz.Server is one. It must be safe for
// concurrent use, must not keep req once it has returned, and its answer
// is only read.
type Checker interface {
	CheckAttributes(ctx context.Context, req descriptors.Request) (*authv3.CheckResponse, error)
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
	attrs    sync.Pool                     // *attrs
	names    names                         // canonical request header names
	out      outHeaders                    // response headers in the server's form
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
	body := readBody(r)
	a, _ := h.attrs.Get().(*attrs)
	if a == nil {
		a = &attrs{}
	}
	err := a.fill(r, h.prefix, &h.names)
	var resp *authv3.CheckResponse
	if err == nil {
		resp, err = h.check(r, a)
	}
	*a = attrs{}
	h.attrs.Put(a)
	body.settle(w)
	switch {
	case errors.Is(err, errCheckFailed):
		plain(w, http.StatusServiceUnavailable, errCheckFailedMsg)
	case err == nil:
		h.write(w, resp, denyStatus(r.Header))
	default:
		var rej *rejection
		if !errors.As(err, &rej) {
			rej = &rejection{ReasonBadURI, err.Error()}
		}
		h.rejected[rej.reason].Inc()
		plain(w, http.StatusBadRequest, rej.msg)
	}
}

// errCheckFailed is check's error for a Checker that failed (logged and
// counted): answered 503.
var errCheckFailed = errors.New("check failed")

// check asks the Checker about req: its answer, or errCheckFailed when it
// fails.
func (h *Handler) check(r *http.Request, req descriptors.Request) (*authv3.CheckResponse, error) {
	resp, err := h.checker.CheckAttributes(r.Context(), req)
	if err == nil && resp == nil {
		err = errors.New("the checker returned no response")
	}
	if err != nil {
		h.rejected[ReasonCheckFailed].Inc()
		if r.Context().Err() == nil {
			h.log.Warn("http_authz: check failed; answered 503", "error", err)
		}
		return nil, errCheckFailed
	}
	return resp, nil
}

// maxBody is how much of a request's body is read (and dropped) while the
// check is decided; past it the connection closes after the answer.
const maxBody = 64 << 10

// bodyRead is a request body being read and dropped beside the check: a
// check needs no body, and the answer must not wait for one that is slow
// to come.
type bodyRead struct {
	done chan struct{}
	err  error // of the read, once done is closed
}

// readBody starts reading r's body in the background when r is an
// HTTP/1.x request with one (HTTP/2 answers a stream without its body
// anyway); nil otherwise.
func readBody(r *http.Request) *bodyRead {
	if r.ProtoMajor != 1 || r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil
	}
	b := &bodyRead{done: make(chan struct{})}
	go func() {
		defer close(b.done)
		n, err := io.Copy(io.Discard, io.LimitReader(r.Body, maxBody+1))
		if err == nil && n > maxBody {
			err = errBodyTooLarge
		}
		b.err = err
	}()
	return b
}

var errBodyTooLarge = errors.New("request body over its bound")

// settle runs before the answer is written; b may be nil (no body). When
// the body has not been read whole, the answer is to say Connection:
// close and the body's read is cut short: the server then writes the
// answer at once and closes the connection, instead of waiting for the
// rest of the body first.
func (b *bodyRead) settle(w http.ResponseWriter) {
	if b == nil {
		return
	}
	select {
	case <-b.done:
		if b.err == nil {
			return
		}
	default:
		_ = http.NewResponseController(w).SetReadDeadline(time.Now())
		<-b.done
	}
	w.Header().Set("Connection", "close")
}

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

// write writes resp as HTTP: OK → 200 with the OK response's headers;
// anything else → the denied response (see the package comment), with
// status override (0: none).
func (h *Handler) write(w http.ResponseWriter, resp *authv3.CheckResponse, override int) {
	hd := w.Header()
	if codes.Code(resp.GetStatus().GetCode()) == codes.OK {
		ok := resp.GetOkResponse()
		h.out.add(hd, ok.GetHeaders())
		h.out.add(hd, ok.GetResponseHeadersToAdd())
		hd["Content-Length"] = zeroLength
		w.WriteHeader(http.StatusOK)
		return
	}
	denied := resp.GetDeniedResponse()
	status := int(denied.GetStatus().GetCode())
	if status < 300 || status > 599 {
		status = http.StatusForbidden // Envoy's default; a 2xx would read as allowed
	}
	h.out.add(hd, denied.GetHeaders())
	body := denied.GetBody()
	if override != 0 {
		if body != "" && isJSON(hd.Get("Content-Type")) {
			body = withStatusMember(body, status, override)
		}
		status = override
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

// outHeaders interns the response headers a Checker answers with (most
// are the same few names and values on every check) in the form the HTTP
// server writes: the canonical name, and the value as a one-element slice
// (whose capacity is its length, so that an append never writes into it).
type outHeaders struct {
	t intern[headerKV, outHeader]
}

// headerKV is a response header as the Checker gives it.
type headerKV struct{ key, value string }

// outHeader is a response header in the HTTP server's form; skip is set
// for one the server writes itself (see framing).
type outHeader struct {
	key  string
	vals []string
	skip bool
}

func newOutHeader(kv headerKV) outHeader {
	if kv.key == "" || kv.key[0] == ':' {
		return outHeader{skip: true}
	}
	k := http.CanonicalHeaderKey(kv.key)
	return outHeader{key: k, vals: []string{kv.value}, skip: framing(k)}
}

// add applies opts to h as Envoy applies them to a response, except the
// pseudo-headers and the headers of the message's framing, which the HTTP
// server writes itself.
func (o *outHeaders) add(h http.Header, opts []*corev3.HeaderValueOption) {
	for _, opt := range opts {
		hv := opt.GetHeader()
		if hv == nil {
			continue
		}
		kv := headerKV{hv.GetKey(), hv.GetValue()}
		var oh outHeader
		if kv.value == "" && len(hv.GetRawValue()) > 0 {
			kv.value = string(hv.GetRawValue())
			oh = newOutHeader(kv)
		} else {
			oh = o.t.get(kv, len(kv.key)+len(kv.value), newOutHeader)
		}
		if oh.skip {
			continue
		}
		k := oh.key
		_, exists := h[k]
		switch appendAction(opt) {
		case corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD:
			h[k] = append(h[k], oh.vals...)
		case corev3.HeaderValueOption_ADD_IF_ABSENT:
			if !exists {
				h[k] = oh.vals
			}
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
			if exists {
				h[k] = oh.vals
			}
		default: // OVERWRITE_IF_EXISTS_OR_ADD
			h[k] = oh.vals
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

// withStatusMember returns the JSON object body of a denial answered
// with from with its top-level "status" member, when that is a number, set
// to status, and its top-level "title" member, when that is from's reason
// phrase (an RFC 9457 problem titled by its status), set to status's;
// body itself when it has no numeric status or is no JSON object. The
// rest of the body is kept byte for byte.
func withStatusMember(body string, from, status int) string {
	dec := json.NewDecoder(strings.NewReader(body))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return body
	}
	// span is a member's value in body, and what replaces it.
	type span struct {
		start, end int
		with       string
	}
	var st, title *span
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return body
		}
		key, _ := t.(string)
		after := int(dec.InputOffset())
		v, err := dec.Token()
		if err != nil {
			return body
		}
		if d, ok := v.(json.Delim); ok && (d == '{' || d == '[') {
			for depth := 1; depth > 0; {
				t, err := dec.Token()
				if err != nil {
					return body
				}
				switch t {
				case json.Delim('{'), json.Delim('['):
					depth++
				case json.Delim('}'), json.Delim(']'):
					depth--
				}
			}
			continue
		}
		end := int(dec.InputOffset())
		start := after + strings.IndexFunc(body[after:end], func(c rune) bool {
			return c != ':' && c != ' ' && c != '\t' && c != '\n' && c != '\r'
		})
		if start < after {
			return body
		}
		switch v := v.(type) {
		case json.Number:
			if key == "status" && st == nil {
				st = &span{start, end, strconv.Itoa(status)}
			}
		case string:
			if key == "title" && title == nil && v == http.StatusText(from) && http.StatusText(status) != "" {
				title = &span{start, end, strconv.Quote(http.StatusText(status))}
			}
		}
	}
	if st == nil {
		return body
	}
	spans := []*span{st}
	if title != nil {
		spans = append(spans, title)
		if title.start > st.start {
			spans[0], spans[1] = title, st
		}
	}
	for _, sp := range spans { // the later one first
		body = body[:sp.start] + sp.with + body[sp.end:]
	}
	return body
}
