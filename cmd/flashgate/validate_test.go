package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
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

// TestValidateEveryError: validate lists every error of a file, one a line
// in file order on stderr, the same on every run, the first 20 then how
// many more, and exits 1 counting them all; with both formats, the errors
// of both.
func TestValidateEveryError(t *testing.T) {
	known := "known keys: key, value, name, rate_limit, shadow_mode, failure_mode, local_share, ban, on_missing, lease, descriptors"
	const three, over = "testdata/bad_three.yaml", "testdata/bad_over_twenty.yaml"
	var overLines strings.Builder
	for i := range 20 {
		fmt.Fprintf(&overLines, "%s:%d:28: requests must be at least 1, not 0\n", over, 5+3*i)
	}
	overLines.WriteString("and 5 more\n")
	threeLines := three + `:4:5: unknown key "zzz" in a descriptor; ` + known + "\n" +
		three + `:5:5: unknown key "aaa" in a descriptor; ` + known + "\n" +
		three + ":8:28: requests must be at least 1, not 0\n"
	const twice = "../../rls/testdata/bad_duplicate_domain"
	tests := map[string]struct {
		args         []string
		stderr, last string
	}{
		"three":       {[]string{"--config", three}, threeLines, "flashgate: 3 errors"},
		"over twenty": {[]string{"--config", over}, overLines.String(), "flashgate: 25 errors"},
		"both formats": {[]string{"--rls-config", twice, "--config", three},
			twice + `/b.yaml:1:1: duplicate domain "twice" (also in ` + twice + "/a.yaml)\n" + threeLines, "flashgate: 4 errors"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			for range 5 {
				var stdout, stderr strings.Builder
				err := runEnv(context.Background(), append([]string{"validate"}, tc.args...),
					env{stdout: &stdout, stderr: &stderr, lookupEnv: func(string) (string, bool) { return "", false }})
				if err == nil {
					t.Fatalf("no error; stdout:\n%s", stdout.String())
				}
				if stderr.String() != tc.stderr {
					t.Fatalf("stderr:\n%s\nwant:\n%s", stderr.String(), tc.stderr)
				}
				if line := errorLine(err); line != tc.last {
					t.Errorf("last line %q, want %q", line, tc.last)
				}
			}
		})
	}
}

// TestValidateRefusesBomb: a nesting bomb, in either format, is refused at
// its position without being parsed.
func TestValidateRefusesBomb(t *testing.T) {
	dir := t.TempDir()
	bomb := filepath.Join(dir, "bomb.yaml")
	if err := os.WriteFile(bomb, []byte("domain: d\ndescriptors: "+strings.Repeat("{a: ", 37500)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--config", bomb}, {"--rls-config", dir}} {
		var stdout, stderr strings.Builder
		err := runEnv(context.Background(), append([]string{"validate"}, args...),
			env{stdout: &stdout, stderr: &stderr, lookupEnv: func(string) (string, bool) { return "", false }})
		if want := bomb + ":2:266: the YAML is nested deeper than 64 levels"; err == nil || !strings.Contains(errorLine(err), want) {
			t.Errorf("validate %v: %v, want %s", args, err, want)
		}
	}
}
