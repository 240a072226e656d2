package daemon

import (
	"fmt"
	"strconv"
	"strings"
)

// ByteSize is a flag value for a number of bytes: "33554432", "64KiB",
// "32MiB", "1GiB", or with SI units "32MB" (10^6). "K", "M", "G" alone mean
// KiB, MiB, GiB.
type ByteSize int64

func (b ByteSize) String() string {
	v := int64(b)
	for _, u := range []struct {
		name string
		size int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if v != 0 && v%u.size == 0 {
			return strconv.FormatInt(v/u.size, 10) + u.name
		}
	}
	return strconv.FormatInt(v, 10)
}

func (b *ByteSize) Type() string { return "bytes" }

func (b *ByteSize) Set(s string) error {
	t := strings.TrimSpace(s)
	units := []struct {
		suffix string
		size   int64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9},
		{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1},
	}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.size
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<50)/mult {
		return fmt.Errorf("%q is not a size in bytes (examples: 33554432, 64KiB, 32MiB)", s)
	}
	*b = ByteSize(n * mult)
	return nil
}
