// Package reqpathtest holds the spellings of a path that every front-end's
// tests send against a rule on an exact path and on a prefix: each form
// package reqpath canonicalises, named.
package reqpathtest

// Exact is the path an exact rule is written on.
const Exact = "/api/login"

// Prefix is the value of a prefix rule, trailing "*" included.
const Prefix = "/api/coupon/*"

// Spelling is one way of writing a path: Form names what it tries.
type Spelling struct {
	Form, Path string
}

// ExactSpellings are spellings of Exact.
var ExactSpellings = []Spelling{
	{"as written", "/api/login"},
	{"trailing slash", "/api/login/"},
	{"double slash", "//api/login"},
	{"inner double slash", "/api//login"},
	{"dot segment", "/api/./login"},
	{"dot dot segment", "/api/x/../login"},
	{"above the root", "/../api/login"},
	{"unreserved escape", "/api/%6Cogin"},
	{"encoded dot segment", "/api/%2E/login"},
	{"parameter", "/api/login;jsessionid=1"},
	{"parameter dot dot", "/api/x/..;/login"},
	{"encoded slash", "/api%2Flogin"},
	{"query", "/api/login?next=/home"},
}

// PrefixSpellings are spellings of paths under Prefix.
var PrefixSpellings = []Spelling{
	{"as written", "/api/coupon/x"},
	{"the directory", "/api/coupon"},
	{"the directory with its slash", "/api/coupon/"},
	{"double slash", "/api//coupon/x"},
	{"dot segment", "/api/./coupon/x"},
	{"dot dot segment", "/api/x/../coupon/x"},
	{"unreserved escape", "/api/%63oupon/x"},
	{"parameter", "/api/coupon;a=1/x"},
	{"encoded slash", "/api/coupon%2Fx"},
	{"encoded slash lower case", "/api/coupon%2fx"},
	{"encoded slash dot dot", "/api/coupon/..%2Fx"},
	{"trailing slash", "/api/coupon/x/"},
}

// Outside are paths neither rule holds.
var Outside = []Spelling{
	{"longer name", "/api/loginx"},
	{"neighbour directory", "/api/coupons"},
	{"dot dot out", "/api/coupon/../x"},
	{"parent", "/api"},
	{"other case", "/API/login"},
}

// Rules is a descriptors file with a rule on Exact (named exact) and one on
// Prefix (named prefix), one request a minute each.
const Rules = `
domain: paths
descriptors:
  - key: path
    value: ` + Exact + `
    name: exact
    rate_limit: {requests: 1, window: 1m}
  - key: path
    value: ` + Prefix + `
    name: prefix
    rate_limit: {requests: 1, window: 1m}
`

// Case is a rule of Rules, a path it holds as written (First), and the
// spellings of paths it holds too.
type Case struct {
	Rule, First string
	Spellings   []Spelling
}

// Cases are Rules' two rules with their spellings.
var Cases = []Case{
	{"exact", Exact, ExactSpellings},
	{"prefix", "/api/coupon/x", PrefixSpellings},
}
