package xds_test

import (
	"strings"
	"testing"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/flashgate/flashgate/rls"
	"github.com/flashgate/flashgate/rls/xds"
)

// TestFiles: a resource becomes the file ratelimit's YAML would be, with
// every field the proto has; the proto's zero unit and requests_per_unit of
// an unlimited limit are fields left out.
func TestFiles(t *testing.T) {
	conf := &rlsconfv3.RateLimitConfig{Name: "edge", Domain: "edge", Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "internal", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true}},
		{Key: "remote_address", Value: "10.*", ShadowMode: true, DetailedMetric: true,
			RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 0}},
		{Key: "path", Value: "/login", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: 10, Name: "login"},
			Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "user", RateLimit: &rlsconfv3.RateLimitPolicy{
				Unit: rlsconfv3.RateLimitUnit_DAY, RequestsPerUnit: 3, Name: "per-user",
				Replaces: []*rlsconfv3.RateLimitReplace{{Name: "login"}}}}}},
	}}
	res, err := anypb.New(conf)
	if err != nil {
		t.Fatal(err)
	}
	files, err := xds.Files([]*anypb.Any{res})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 1 || files[0].Name != "xds:edge" {
		t.Fatalf("files %+v", files)
	}
	cfg, err := rls.ParseFiles(files)
	if err != nil {
		t.Fatalf("%v\n%s", err, files[0].Data)
	}
	d := cfg.Domain("edge")
	if d == nil || len(d.Rules()) != 4 {
		t.Fatalf("domain edge: %+v\n%s", d, files[0].Data)
	}
	r := d.Rules()
	if !r[0].Unlimited || !r[1].Shadow || r[1].RequestsPerUnit != 0 || r[2].RequestsPerUnit != 10 ||
		len(r[3].Replaces) != 1 || r[3].Replaces[0] != "login" {
		t.Fatalf("rules %+v\n%s", r, files[0].Data)
	}
}

// TestFilesRefused: a resource of another type, or one that does not
// decode, is refused before any parse.
func TestFilesRefused(t *testing.T) {
	other, err := anypb.New(durationpb.New(0))
	if err != nil {
		t.Fatal(err)
	}
	garbage := &anypb.Any{TypeUrl: xds.TypeURL, Value: []byte{0xff, 0xff}}
	for name, res := range map[string]*anypb.Any{"other type": other, "undecodable": garbage} {
		t.Run(name, func(t *testing.T) {
			if _, err := xds.Files([]*anypb.Any{res}); err == nil || !strings.Contains(err.Error(), "resource 0") {
				t.Fatalf("error %v", err)
			}
		})
	}
}
