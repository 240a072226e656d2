package httpauthz

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
)

// Decider decides the request req describes into a, the core's answer;
// *extauthz.Server is one. It must be safe for concurrent use and keep
// neither req nor a. An error is answered 503.
type Decider interface {
	Decide(ctx context.Context, req descriptors.Request, a *enforce.Answer) error
	// Headers returns the rate-limit header families.
	Headers() enforce.Families
}

// Options configure a [Handler]. Only Decider is required.
type Options struct {
	Decider Decider
	// PathPrefix is http_service's path_prefix, stripped at a "/" boundary
	// when no original URI header is set; "" or "/" for none.
	PathPrefix string
	// Registerer takes the rejected counter; nil registers it nowhere.
	Registerer prometheus.Registerer
	// Logger logs Decider errors; nil discards them.
	Logger *slog.Logger
}

// Handler is the HTTP front-end, built with [New]; safe for concurrent use.
type Handler struct {
	decider  Decider
	families enforce.Families
	prefix   string
	log      *slog.Logger
	rejected map[string]prometheus.Counter // by reason, every reason present
	checks   sync.Pool                     // *check
	names    names                         // canonical request header names
	keys     [enforce.MaxFields]string     // each answer field's name, canonical
	values   values                        // answer field values in the server's form
}

var _ http.Handler = (*Handler)(nil)

// check is the pooled scratch of one check.
type check struct {
	attrs  attrs
	answer enforce.Answer
	buf    []byte
}

// New returns a Handler; it fails without a Decider, for a PathPrefix that
// is not a path, or when its metric cannot be registered.
func New(opts Options) (*Handler, error) {
	if opts.Decider == nil {
		return nil, errors.New("httpauthz: no decider given")
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
	h := &Handler{decider: opts.Decider, families: opts.Decider.Headers(), prefix: prefix, log: opts.Logger,
		rejected: map[string]prometheus.Counter{}}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	for _, r := range reasons {
		h.rejected[r] = vec.WithLabelValues(r)
	}
	for k := range h.keys {
		h.keys[k] = http.CanonicalHeaderKey(enforce.Field(k).Name())
	}
	return h, nil
}

// ServeHTTP implements http.Handler: it checks and answers r.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body := readBody(r)
	c, _ := h.checks.Get().(*check)
	if c == nil {
		c = &check{}
	}
	err := c.attrs.fill(r, h.prefix, &h.names)
	if err == nil {
		err = h.decide(r, c)
	}
	c.attrs = attrs{}
	body.settle(w)
	switch {
	case errors.Is(err, errCheckFailed):
		plain(w, http.StatusServiceUnavailable, errCheckFailedMsg)
	case err == nil:
		h.write(w, r, c)
	default:
		var rej *rejection
		if !errors.As(err, &rej) {
			rej = &rejection{ReasonBadURI, err.Error()}
		}
		h.rejected[rej.reason].Inc()
		plain(w, http.StatusBadRequest, rej.msg)
	}
	clear(c.answer.Policies)
	clear(c.answer.States)
	h.checks.Put(c)
}

// errCheckFailed is decide's error for a failed Decider: answered 503.
var errCheckFailed = errors.New("check failed")

// decide asks the Decider about c's request, its answer into c.
func (h *Handler) decide(r *http.Request, c *check) error {
	if err := h.decider.Decide(r.Context(), &c.attrs, &c.answer); err != nil {
		h.rejected[ReasonCheckFailed].Inc()
		if r.Context().Err() == nil {
			h.log.Warn("http_authz: check failed; answered 503", "error", err)
		}
		return errCheckFailed
	}
	return nil
}

// maxBody is how much of a body is read and dropped beside the check;
// past it the connection closes after the answer.
const maxBody = 64 << 10

// bodyRead is a body read and dropped beside the check, so the answer
// does not wait for a slow one.
type bodyRead struct {
	done chan struct{}
	err  error // of the read, once done is closed
}

// readBody starts reading an HTTP/1.x request's body; nil without one.
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

// settle runs before the answer is written (b may be nil): when the body
// is not read whole, the answer closes the connection instead of waiting
// for the rest.
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

// denyStatus returns the 401 or 403 X-Flashgate-Deny-Status asks for, or 0.
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

// write writes c's answer: 200 without a body, or a denial's status with
// its problem body, in enforce's field order.
func (h *Handler) write(w http.ResponseWriter, r *http.Request, c *check) {
	a, hd := &c.answer, w.Header()
	var fields [enforce.MaxFields]enforce.Field
	for _, k := range h.families.AppendFields(fields[:0], a.Denied, a.Shadow) {
		if c.buf = a.AppendValue(c.buf[:0], k); len(c.buf) > 0 {
			hd[h.keys[k]] = h.values.get(c.buf)
		}
	}
	if !a.Denied {
		// The server sends Content-Length: 0 itself, except to HEAD.
		if r.Method == http.MethodHead {
			hd["Content-Length"] = zeroLength
		}
		w.WriteHeader(http.StatusOK)
		return
	}
	status, title := http.StatusTooManyRequests, enforce.ProblemTitle
	if override := denyStatus(r.Header); override != 0 {
		status, title = override, http.StatusText(override)
	}
	c.buf = a.AppendProblem(c.buf[:0], status, title)
	var n [20]byte
	hd["Content-Length"] = h.values.get(strconv.AppendInt(n[:0], int64(len(c.buf)), 10))
	w.WriteHeader(status)
	_, _ = w.Write(c.buf)
}

// zeroLength is a body-less answer's Content-Length; never modified.
var zeroLength = []string{"0"}

// values interns answer header values as one-element slices whose capacity
// is their length, so an append never writes into them.
type values struct {
	t intern[string, []string]
}

// get returns b's value, interned; b is not kept.
func (v *values) get(b []byte) []string {
	if m := v.t.m.Load(); m != nil {
		if vs, ok := (*m)[string(b)]; ok {
			return vs
		}
	}
	s := string(b)
	return v.t.get(s, len(s), oneValue)
}

func oneValue(s string) []string { return []string{s} }
