package yamlguard

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// allocated returns the bytes f allocates (runtime.MemStats.TotalAlloc,
// which counts every allocation whatever the garbage collector does).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// blockNest is n mappings, each indented under the previous one's key.
func blockNest(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "%sa:\n", strings.Repeat(" ", i))
	}
	return b.String()
}

// TestBombsRefused: nesting that makes go-yaml's parser quadratic is
// refused at the token that passes MaxDepth, having allocated a bounded
// amount, whatever the file's size.
func TestBombsRefused(t *testing.T) {
	tests := map[string]struct {
		data      string
		line, col int
	}{
		"flow sequences":      {strings.Repeat("[", 30000), 1, 65},
		"flow mappings":       {"domain: x\ndescriptors: " + strings.Repeat("{a: ", 37500), 2, 266},
		"block sequences":     {"domain: x\ndescriptors:\n" + strings.Repeat("- ", 100000), 3, 127},
		"block mappings":      {blockNest(1000), 65, 65},
		"mixed, one per line": {strings.Repeat("- [\n", 20000), 64, 3},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var err error
			n := allocated(func() { _, err = Parse([]byte(tc.data)) })
			var ge *Error
			if !errors.As(err, &ge) {
				t.Fatalf("a %d-byte bomb: %v, want an *Error", len(tc.data), err)
			}
			if !strings.Contains(ge.Msg, "nested deeper than 64 levels") || ge.Line != tc.line || ge.Column != tc.col {
				t.Errorf("error %v, want nested deeper than 64 levels at %d:%d", err, tc.line, tc.col)
			}
			if n > 64<<20 {
				t.Errorf("refusing a %d-byte bomb allocated %d MiB, want < 64", len(tc.data), n>>20)
			}
			t.Logf("%d bytes refused after %d KiB allocated: %v", len(tc.data), n>>10, err)
		})
	}
}

// TestTooManyTokens: a file of more than MaxTokens tokens is refused
// before it is lexed, at the token past the bound.
func TestTooManyTokens(t *testing.T) {
	data := "descriptors: [" + strings.Repeat("a,", MaxTokens/2) + "]\n"
	var err error
	n := allocated(func() { _, err = Parse([]byte(data)) })
	var ge *Error
	if !errors.As(err, &ge) || !strings.Contains(ge.Msg, fmt.Sprintf("more than %d YAML tokens", MaxTokens)) {
		t.Fatalf("%d tokens: %v, want an *Error on the token count", MaxTokens+2, err)
	}
	// "descriptors", ":" and "[" are three, then "a" and "," from column 15.
	if ge.Line != 1 || ge.Column != MaxTokens+12 {
		t.Errorf("at %d:%d, want 1:%d", ge.Line, ge.Column, MaxTokens+12)
	}
	if n > 1<<20 {
		t.Errorf("the count allocated %d KiB, want nothing", n>>10)
	}
}

// TestWithinBounds: files within the bounds parse as go-yaml parses them,
// the largest allowed with a bounded heap: no quadratic cost is left once
// the depth is bounded.
func TestWithinBounds(t *testing.T) {
	deep := strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)
	tests := map[string]string{
		"empty":               "",
		"comments":            "# nothing\n",
		"descriptors":         "domain: d\ndescriptors:\n  - key: path\n    value: /api/*\n    rate_limit: {requests: 5, window: 1s}\n",
		"depth at the bound":  deep,
		"block at the bound":  blockNest(MaxDepth),
		"deep, many times":    strings.Repeat("- "+deep[1:len(deep)-1]+"\n", MaxTokens/(2*MaxDepth+1)),
		"quoted brackets":     `a: "` + strings.Repeat("[", 1000) + `"`,
		"literal of brackets": "a: |\n  " + strings.Repeat("[", 1000) + "\nb: c\n",
	}
	for name, data := range tests {
		t.Run(name, func(t *testing.T) {
			var err error
			n := allocated(func() { _, err = Parse([]byte(data)) })
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if n > 256<<20 {
				t.Errorf("a %d-byte file allocated %d MiB", len(data), n>>20)
			}
			t.Logf("%d bytes parsed, %d KiB allocated", len(data), n>>10)
		})
	}
}

// TestSyntaxErrorsPassThrough: a file within the bounds that go-yaml
// refuses gets go-yaml's own error, not an *Error.
func TestSyntaxErrorsPassThrough(t *testing.T) {
	_, err := Parse([]byte("a: {b: c\n"))
	var ge *Error
	if err == nil || errors.As(err, &ge) {
		t.Fatalf("error %v, want go-yaml's syntax error", err)
	}
}

// TestLiveHeapAtTheBound: the largest file Parse accepts, MaxTokens tokens
// of one flat list, leaves a syntax tree of less than 80 MiB of live heap.
func TestLiveHeapAtTheBound(t *testing.T) {
	data := []byte("[" + strings.Repeat("a,", MaxTokens/2-1) + "]")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f, err := Parse(data)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(f)
	live := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	if live > 80<<20 {
		t.Errorf("the tree of %d tokens holds %d MiB, want < 80", MaxTokens, live>>20)
	}
	t.Logf("%d bytes, %d MiB live, %d MiB allocated", len(data), live>>20, (after.TotalAlloc-before.TotalAlloc)>>20)
}
