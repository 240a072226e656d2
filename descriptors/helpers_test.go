package descriptors

import "testing"

// parse parses yaml as test.yaml, failing t on an error.
func parse(t testing.TB, yaml string) *Config {
	t.Helper()
	c, err := ParseConfig("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// request is a Request of fixed values.
type request struct {
	path, method, authority, peer string
	headers, extensions           map[string]string
}

func (r *request) Path() string        { return r.path }
func (r *request) Method() string      { return r.method }
func (r *request) Authority() string   { return r.authority }
func (r *request) PeerAddress() string { return r.peer }

func (r *request) Header(name string) (string, bool) {
	v, ok := r.headers[name]
	return v, ok
}

func (r *request) ContextExtension(key string) (string, bool) {
	v, ok := r.extensions[key]
	return v, ok
}
