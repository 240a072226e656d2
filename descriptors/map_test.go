package descriptors

import (
	"testing"

	"github.com/flashgate/flashgate/window"
)

// TestMappingConstKeys: the Mapper's prebuilt constant keys give the same
// hits as keys built per request.
func TestMappingConstKeys(t *testing.T) {
	cfg := parse(t, `
domain: d
sources:
  path: {request_path: {}}
  uid: {request_headers: {header_name: x-uid}}
descriptors:
  - key: path
    value: /api/coupon/*
    rate_limit: {requests: 1000, window: 1s}
    descriptors:
      - key: uid
        rate_limit: {requests: 5, window: 1s}
`)
	keys, err := window.NewKeys("ck")
	if err != nil {
		t.Fatal(err)
	}
	r := &request{path: "/api/coupon/claim", headers: map[string]string{"x-uid": "u1"}}
	var per, pre Mapping
	(&Mapper{cfg: cfg, keys: keys}).Map(r, false, &per)
	NewMapper(cfg, keys).Map(r, false, &pre)
	if len(per.Hits) != 2 || len(pre.Hits) != 2 {
		t.Fatalf("hits: %d and %d, want 2 each", len(per.Hits), len(pre.Hits))
	}
	for i := range per.Hits {
		if per.Hits[i] != pre.Hits[i] {
			t.Errorf("hit %d: %+v per request, %+v prebuilt", i, per.Hits[i], pre.Hits[i])
		}
	}
}
