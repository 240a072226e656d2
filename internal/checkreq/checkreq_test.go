package checkreq

import "testing"

func TestParseHeaders(t *testing.T) {
	tests := map[string]struct {
		in      []string
		want    map[string]string
		wantErr bool
	}{
		"lower-cased and trimmed": {in: []string{"X-UID:  alice "}, want: map[string]string{"x-uid": "alice"}},
		"colon in value":          {in: []string{"x-t: a:b"}, want: map[string]string{"x-t": "a:b"}},
		"repeated joined":         {in: []string{"a: 1", "A: 2"}, want: map[string]string{"a": "1,2"}},
		"pseudo-header":           {in: []string{":authority: example.com"}, want: map[string]string{":authority": "example.com"}},
		"empty value":             {in: []string{"x-empty:"}, want: map[string]string{"x-empty": ""}},
		"no colon":                {in: []string{"nope"}, wantErr: true},
		"empty name":              {in: []string{": v"}, wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseHeaders(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v", err)
			}
			if tc.wantErr {
				return
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}
