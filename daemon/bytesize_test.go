package daemon

import "testing"

func TestByteSize(t *testing.T) {
	tests := map[string]int64{
		"0": 0, "33554432": 32 << 20, "64KiB": 64 << 10, "32MiB": 32 << 20, "1GiB": 1 << 30,
		"32MB": 32e6, "5K": 5 << 10, "7M": 7 << 20, "100B": 100, " 2 MiB ": 2 << 20,
	}
	for in, want := range tests {
		var b ByteSize
		if err := b.Set(in); err != nil || int64(b) != want {
			t.Errorf("Set(%q) = %d, %v; want %d", in, b, err, want)
		}
	}
	for _, in := range []string{"", "-1", "1.5MiB", "lots", "1TiB", "99999999999GiB"} {
		var b ByteSize
		if err := b.Set(in); err == nil {
			t.Errorf("Set(%q) = %d, want an error", in, b)
		}
	}
	b := ByteSize(32 << 20)
	if b.String() != "32MiB" {
		t.Errorf("String = %q", b.String())
	}
}
