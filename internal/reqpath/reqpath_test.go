package reqpath

import (
	"strings"
	"testing"

	"github.com/flashgate/flashgate/internal/reqpath/reqpathtest"
)

func TestCanonical(t *testing.T) {
	fold := Form{FoldCase: true}
	keep := Form{KeepEncodedSlash: true}
	for name, tc := range map[string]struct {
		in   string
		f    Form
		want string
	}{
		"canonical":             {"/api/login", Form{}, "/api/login"},
		"root":                  {"/", Form{}, "/"},
		"empty":                 {"", Form{}, "/"},
		"query only":            {"?a=1", Form{}, "/"},
		"no leading slash":      {"api/login", Form{}, "/api/login"},
		"asterisk form":         {"*", Form{}, "/*"},
		"trailing slash":        {"/api/login/", Form{}, "/api/login"},
		"trailing slashes":      {"/api/login///", Form{}, "/api/login"},
		"double slash":          {"//api//login", Form{}, "/api/login"},
		"dot":                   {"/api/./login", Form{}, "/api/login"},
		"trailing dot":          {"/api/login/.", Form{}, "/api/login"},
		"dot dot":               {"/api/x/../login", Form{}, "/api/login"},
		"trailing dot dot":      {"/api/login/x/..", Form{}, "/api/login"},
		"above root":            {"/../../api/login", Form{}, "/api/login"},
		"only dot dot":          {"/..", Form{}, "/"},
		"dots in a name":        {"/api/..login/...", Form{}, "/api/..login/..."},
		"unreserved escape":     {"/api/%6Cogin", Form{}, "/api/login"},
		"lower hex escape":      {"/api/%6cogin", Form{}, "/api/login"},
		"tilde escape":          {"/%7Euser", Form{}, "/~user"},
		"encoded dots":          {"/api/x/%2E%2e/login", Form{}, "/api/login"},
		"reserved escape":       {"/a%3bb", Form{}, "/a%3Bb"},
		"reserved escape upper": {"/a%3Bb", Form{}, "/a%3Bb"},
		"bad escape":            {"/a%zz", Form{}, "/a%25zz"},
		"short escape":          {"/a%4", Form{}, "/a%254"},
		"escaped percent":       {"/a%25zz", Form{}, "/a%25zz"},
		"raw space":             {"/a b", Form{}, "/a%20b"},
		"raw non-ASCII":         {"/café", Form{}, "/caf%C3%A9"},
		"encoded non-ASCII":     {"/caf%c3%a9", Form{}, "/caf%C3%A9"},
		"backslash":             {`/a\b`, Form{}, "/a%5Cb"},
		"sub-delims kept":       {"/a!$&'()*+,=:@b", Form{}, "/a!$&'()*+,=:@b"},
		"query":                 {"/api/login?next=/x", Form{}, "/api/login"},
		"fragment":              {"/api/login#top", Form{}, "/api/login"},
		"slash before query":    {"/api/login/?x", Form{}, "/api/login"},
		"parameter":             {"/api/login;jsessionid=1", Form{}, "/api/login"},
		"parameter per segment": {"/api;v=1/login;x", Form{}, "/api/login"},
		"parameter dot dot":     {"/api/x/..;/login", Form{}, "/api/login"},
		"parameter only":        {"/;x/api", Form{}, "/api"},
		"encoded semicolon":     {"/api/login%3Bx", Form{}, "/api/login%3Bx"},
		"encoded slash":         {"/api/coupon%2Fx", Form{}, "/api/coupon/x"},
		"encoded slash lower":   {"/api/coupon%2fx", Form{}, "/api/coupon/x"},
		"encoded slash dots":    {"/api/coupon/..%2Fx", Form{}, "/api/x"},
		"encoded slash kept":    {"/api/coupon%2fx", keep, "/api/coupon%2Fx"},
		"kept slash dots":       {"/api/coupon/..%2Fx", keep, "/api/coupon/..%2Fx"},
		"case kept":             {"/API/Login", Form{}, "/API/Login"},
		"case folded":           {"/API/%4Cogin/%c3%A9", fold, "/api/login/%C3%A9"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := Canonical(tc.in, tc.f); got != tc.want {
				t.Errorf("Canonical(%q, %+v) = %q, want %q", tc.in, tc.f, got, tc.want)
			}
		})
	}
}

func TestCanonicalReturnsCanonicalPathsAsTheyAre(t *testing.T) {
	for _, p := range []string{"/", "/api/coupon/123", "/a!$&'()*+,=:@b/~x_y-z.1"} {
		if n := testing.AllocsPerRun(100, func() { _ = Canonical(p, Form{}) }); n != 0 {
			t.Errorf("Canonical(%q) allocates %v times, want 0", p, n)
		}
	}
}

func TestHasEncodedSlash(t *testing.T) {
	for in, want := range map[string]bool{
		"/a%2Fb": true, "/a%2fb": true, "/%2F": true, "/a%252Fb": false, "/a/b": false,
		"/a?x=%2F": false, "/a%2": false, "/a%%2F": true, "%": false,
	} {
		if got := HasEncodedSlash(in); got != want {
			t.Errorf("HasEncodedSlash(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestPattern(t *testing.T) {
	for name, tc := range map[string]struct {
		body   string
		prefix bool
		value  string
		dir    bool
	}{
		"exact":               {"/api/login", false, "/api/login", false},
		"exact spelt oddly":   {"//api/./x/../%6Cogin/", false, "/api/login", false},
		"exact root":          {"/", false, "/", false},
		"dir prefix":          {"/api/coupon/", true, "/api/coupon/", true},
		"dir prefix oddly":    {"/api//coupon/./", true, "/api/coupon/", true},
		"root prefix":         {"/", true, "/", true},
		"partial prefix":      {"/api/co", true, "/api/co", false},
		"partial dot prefix":  {"/api/.", true, "/api/.", false},
		"partial dots prefix": {"/api/x/../..", true, "/api/..", false},
		"partial escape":      {"/api/%6C", true, "/api/l", false},
		"partial unfinished":  {"/api/%4", true, "/api/%254", false},
	} {
		t.Run(name, func(t *testing.T) {
			v, dir, err := Pattern(tc.body, tc.prefix, Form{})
			if err != nil || v != tc.value || dir != tc.dir {
				t.Errorf("Pattern(%q, %v) = %q, %v, %v; want %q, %v", tc.body, tc.prefix, v, dir, err, tc.value, tc.dir)
			}
		})
	}
	for _, body := range []string{"", "api/login", "/api?x", "/api#x", "/api;x"} {
		if _, _, err := Pattern(body, false, Form{}); err == nil {
			t.Errorf("Pattern(%q) = nil error, want one", body)
		}
	}
}

// TestPatternsHoldEverySpelling: a rule on an exact path and on a prefix
// holds each spelling of a path they cover, in one of its readings, and
// not a neighbour's.
func TestPatternsHoldEverySpelling(t *testing.T) {
	holds := func(p, body string, prefix bool) bool {
		v, dir, err := Pattern(body, prefix, Form{})
		if err != nil {
			t.Fatal(err)
		}
		if Matches(Canonical(p, Form{}), v, prefix, dir) {
			return true
		}
		return HasEncodedSlash(p) && Matches(Canonical(p, Form{KeepEncodedSlash: true}), v, prefix, dir)
	}
	prefix := strings.TrimSuffix(reqpathtest.Prefix, "*")
	for _, s := range reqpathtest.ExactSpellings {
		if !holds(s.Path, reqpathtest.Exact, false) {
			t.Errorf("%s: %q (canonical %q) is not held by %s", s.Form, s.Path, Canonical(s.Path, Form{}), reqpathtest.Exact)
		}
	}
	for _, s := range reqpathtest.PrefixSpellings {
		if !holds(s.Path, prefix, true) {
			t.Errorf("%s: %q (canonical %q) is not held by %s", s.Form, s.Path, Canonical(s.Path, Form{}), reqpathtest.Prefix)
		}
	}
	for _, s := range reqpathtest.Outside {
		if holds(s.Path, reqpathtest.Exact, false) || holds(s.Path, prefix, true) {
			t.Errorf("%s: %q (canonical %q) is held by %s or %s", s.Form, s.Path, Canonical(s.Path, Form{}), reqpathtest.Exact, reqpathtest.Prefix)
		}
	}
	fv, _, _ := Pattern("/API/Login", false, Form{FoldCase: true})
	for _, p := range []string{"/api/login", "/API/LOGIN/", "/Api/%4cogin"} {
		if c := Canonical(p, Form{FoldCase: true}); !Matches(c, fv, false, false) {
			t.Errorf("folded: %q (canonical %q) is not held by /API/Login", p, c)
		}
	}
}

func FuzzCanonical(f *testing.F) {
	for _, s := range []string{
		"/api/login", "//a/./b/../c/", "/%2e%2E/%6C;x=1/%2F", "/a%zz%4", "/café?x#y", "/..;/a", "",
	} {
		f.Add(s, false, false)
	}
	f.Fuzz(func(t *testing.T, p string, foldCase, keepSlash bool) {
		form := Form{FoldCase: foldCase, KeepEncodedSlash: keepSlash}
		c := Canonical(p, form)
		if again := Canonical(c, form); again != c {
			t.Fatalf("Canonical(%q) = %q, whose canonical form is %q", p, c, again)
		}
		if !isCanonical(c, foldCase) && strings.IndexByte(c, '%') < 0 {
			t.Fatalf("Canonical(%q) = %q, which is not canonical", p, c)
		}
		if c[0] != '/' || c != "/" && c[len(c)-1] == '/' || strings.Contains(c, "//") ||
			strings.Contains(c+"/", "/./") || strings.Contains(c+"/", "/../") || strings.ContainsAny(c, "?#;") {
			t.Fatalf("Canonical(%q) = %q keeps a form it removes", p, c)
		}
		for i := 0; i < len(c); i++ {
			switch b := c[i]; {
			case b == '%':
				if i+2 >= len(c) || !isHex(c[i+1]) || !isHex(c[i+2]) {
					t.Fatalf("Canonical(%q) = %q has a bad escape at %d", p, c, i)
				}
				d := unhex(c[i+1])<<4 | unhex(c[i+2])
				if unreserved(d) || !keepSlash && d == '/' || strings.ToUpper(c[i:i+3]) != c[i:i+3] {
					t.Fatalf("Canonical(%q) = %q keeps escape %s", p, c, c[i:i+3])
				}
				i += 2
			case b != '/' && !rawPchar(b), foldCase && 'A' <= b && b <= 'Z':
				t.Fatalf("Canonical(%q) = %q holds byte %q", p, c, b)
			}
		}
		// Spellings of the same path are the same path.
		base := strings.TrimRight(p, "/")
		if strings.ContainsAny(p, "?#") || strings.HasSuffix(base, "%") || strings.HasSuffix(base, "/..") ||
			strings.HasSuffix(base, "/.") || base == ".." || base == "." {
			return
		}
		for _, q := range []string{p + "/", "/" + p, p + ";x=1", p + "/.", p + "/x/..", p + "?q"} {
			if got := Canonical(q, form); got != c {
				t.Fatalf("Canonical(%q) = %q, but Canonical(%q) = %q", q, got, p, c)
			}
		}
	})
}
