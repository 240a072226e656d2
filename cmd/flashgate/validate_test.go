package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	tests := map[string]struct {
		args    []string
		env     map[string]string
		want    []string // in stdout
		wantErr string   // regexp of errorLine(err)
	}{
		"built-in example": {
			want: []string{"domain flashsale (built-in:flashsale.yaml)", "coupon_per_uid", "coupon_per_device", "per_ip", "5/1s"},
		},
		"good file": {
			args: []string{"--config", "testdata/good.yaml"},
			want: []string{"domain shop (testdata/good.yaml)", "per_uid", "header x-uid", "3/1s", "shadow"},
		},
		"file from the environment": {
			env:  map[string]string{"FLASHGATE_CONFIG": "testdata/good.yaml"},
			want: []string{"domain shop"},
		},
		"flag wins over the environment": {
			args: []string{"--config", "testdata/good.yaml"},
			env:  map[string]string{"FLASHGATE_CONFIG": "testdata/bad_unknown_key.yaml"},
			want: []string{"domain shop"},
		},
		"unknown key": {
			args:    []string{"--config", "testdata/bad_unknown_key.yaml"},
			wantErr: `^testdata/bad_unknown_key\.yaml:7:5: unknown key "rate_limt"`,
		},
		"missing file": {
			args:    []string{"--config", "testdata/nope.yaml"},
			wantErr: `^flashgate: .*nope\.yaml.*no such file`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			err := runEnv(context.Background(), append([]string{"validate"}, tc.args...),
				env{stdout: &stdout, stderr: &stderr, lookupEnv: lookup})
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("no error; stdout:\n%s", stdout.String())
				}
				if line := errorLine(err); !regexp.MustCompile(tc.wantErr).MatchString(line) {
					t.Fatalf("error line %q does not match %q", line, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("validate: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, stdout.String())
				}
			}
		})
	}
}
