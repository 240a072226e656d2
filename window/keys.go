package window

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
)

// MaxVerbatim is the longest value kept verbatim in a key; longer values are
// hashed.
const MaxVerbatim = 64

// MaxPrefix is the longest key prefix [NewKeys] accepts.
const MaxPrefix = 32

// MaxKeyLen bounds the length of every key [Keys.Key] returns, whatever the
// rule and value.
const MaxKeyLen = MaxPrefix + len(":{xxxxxx}:") + MaxVerbatim + 1 + MaxVerbatim

// Keys builds limit keys of the form
//
//	<prefix>:{<tag>}:<rule>:<value>
//
// The tag is six hex digits of a hash of rule and value, generated here, so
// that keys spread over Redis Cluster slots and no request value can form a
// hash tag. Rule and value are kept verbatim when they are at most
// MaxVerbatim bytes of [A-Za-z0-9._-]; otherwise they are replaced by "#"
// and 22 base64url characters of their SHA-256 (132 bits), which no verbatim
// segment can equal. So keys are bounded (MaxKeyLen) and two different
// (rule, value) pairs never share a key, short of a SHA-256 collision.
//
// The zero Keys uses the prefix "fg". Keys is a value; it is safe for
// concurrent use.
type Keys struct {
	prefix string
}

// NewKeys returns a key builder for prefix, which must be 1 to MaxPrefix
// characters of [A-Za-z0-9._-].
func NewKeys(prefix string) (Keys, error) {
	if prefix == "" {
		return Keys{}, fmt.Errorf("key prefix is empty")
	}
	if len(prefix) > MaxPrefix || !SafeName(prefix) {
		return Keys{}, fmt.Errorf("key prefix %q: must be 1 to %d characters of A-Z a-z 0-9 . _ -", prefix, MaxPrefix)
	}
	return Keys{prefix: prefix}, nil
}

// Prefix returns the key prefix.
func (k Keys) Prefix() string {
	if k.prefix == "" {
		return "fg"
	}
	return k.prefix
}

// Key returns the key of value under rule. It never fails; see [Keys].
func (k Keys) Key(rule, value string) string {
	var b strings.Builder
	k.keyHead(&b, rule, fnv32(rule, value), len(value))
	writeSegment(&b, value)
	return b.String()
}

// KeyBytes is Key for a value held in a byte slice, so that a caller can
// build the value in a reused or stack buffer: KeyBytes(r, []byte(v)) ==
// Key(r, v). It does not retain value.
func (k Keys) KeyBytes(rule string, value []byte) string {
	var b strings.Builder
	k.keyHead(&b, rule, fnv32(rule, value), len(value))
	if len(value) <= MaxVerbatim && verbatim(value) {
		b.Write(value)
	} else {
		writeHashed(&b, sha256.Sum256(value))
	}
	return b.String()
}

// keyHead starts a key in b: prefix, tag from hash h, rule, and the ':'
// before a value of n bytes, whose room it reserves.
func (k Keys) keyHead(b *strings.Builder, rule string, h uint32, n int) {
	const hexdigits = "0123456789abcdef"
	p := k.Prefix()
	b.Grow(len(p) + 10 + min(len(rule), MaxVerbatim) + 1 + min(n, MaxVerbatim))
	b.WriteString(p)
	b.WriteString(":{")
	for shift := 20; shift >= 0; shift -= 4 {
		b.WriteByte(hexdigits[(h>>shift)&0xf])
	}
	b.WriteString("}:")
	writeSegment(b, rule)
	b.WriteByte(':')
}

func writeSegment(b *strings.Builder, s string) {
	if len(s) <= MaxVerbatim && verbatim(s) {
		b.WriteString(s)
		return
	}
	writeHashed(b, sha256.Sum256([]byte(s)))
}

// writeHashed writes '#' and 22 base64url characters of sum.
func writeHashed(b *strings.Builder, sum [sha256.Size]byte) {
	var enc [44]byte
	base64.RawURLEncoding.Encode(enc[:], sum[:])
	b.WriteByte('#')
	b.Write(enc[:22])
}

// SafeName reports whether s uses only the characters A-Z a-z 0-9 . _ -,
// the alphabet a key keeps verbatim (the empty string passes). Callers that
// name things put into keys (rule names, domains, prefixes) check it so that
// those names stay readable in every key. It is safe for concurrent use.
func SafeName(s string) bool { return verbatim(s) }

// verbatim is SafeName for a string or a byte slice.
func verbatim[S ~string | ~[]byte](s S) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// fnv32 is FNV-1a over rule, a zero byte and value.
func fnv32[S ~string | ~[]byte](rule string, value S) uint32 {
	const offset, prime = 2166136261, 16777619
	h := uint32(offset)
	for i := 0; i < len(rule); i++ {
		h = (h ^ uint32(rule[i])) * prime
	}
	h *= prime // the zero separator
	for i := 0; i < len(value); i++ {
		h = (h ^ uint32(value[i])) * prime
	}
	return h
}

// Fleet returns the heartbeat key of domain's fleet: "<prefix>:fleet:" and
// the domain, hashed like a value when it is long or unsafe. It cannot
// collide with a limit key, whose second segment is a "{tag}".
func (k Keys) Fleet(domain string) string { return k.domainKey("fleet", domain) }

// Settle returns the key where domain's fleet agrees when a settle after an
// outage ends: "<prefix>:settle:" and the domain, as [Keys.Fleet].
func (k Keys) Settle(domain string) string { return k.domainKey("settle", domain) }

// domainKey returns "<prefix>:<kind>:" and domain, hashed like a value
// when it is long or unsafe.
func (k Keys) domainKey(kind, domain string) string {
	var b strings.Builder
	b.WriteString(k.Prefix())
	b.WriteByte(':')
	b.WriteString(kind)
	b.WriteByte(':')
	if len(domain) <= MaxVerbatim && verbatim(domain) && domain != "" {
		b.WriteString(domain)
	} else {
		writeHashed(&b, sha256.Sum256([]byte(domain)))
	}
	return b.String()
}
