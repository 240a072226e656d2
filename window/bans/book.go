package bans

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/flashgate/flashgate/window"
)

// CheckDuration reports why a ban of d may not be given by hand: it must be
// positive and at most window.MaxBanDuration.
func CheckDuration(d time.Duration) error {
	switch {
	case d <= 0:
		return errors.New("must be positive")
	case d > window.MaxBanDuration:
		return fmt.Errorf("longer than the maximum of %s (one year)", window.MaxBanDuration)
	}
	return nil
}

// Origin tells how a ban was raised: by denials crossing a rule's
// threshold, or by hand (an operator).
type Origin uint8

const (
	// ByThreshold: the fleet's denials of the key crossed its rule's
	// threshold within the rule's ban window.
	ByThreshold Origin = iota
	// ByHand: an operator added it.
	ByHand
)

// String returns "threshold" or "hand".
func (o Origin) String() string {
	if o == ByHand {
		return "hand"
	}
	return "threshold"
}

// Entry is one ban in force: its limit key (as window.Keys builds it) and
// when it ends.
type Entry struct {
	Key   string
	Until time.Time
}

// Rule returns the rule segment of the ban's key ("<prefix>:{tag}:<rule>:
// <value>"): the rule's name as window.Keys wrote it (hashed when it is not
// a safe name; the RLS's keys hold "rls.<domain>").
func (e Entry) Rule() string { return KeyRule(e.Key) }

// Value returns the value segment of the ban's key when the key holds it
// verbatim; ok is false when it holds a hash (a long or unsafe value is
// never recoverable from its key).
func (e Entry) Value() (v string, ok bool) {
	i := strings.Index(e.Key, "}:")
	if i < 0 {
		return "", false
	}
	rest := e.Key[i+2:]
	j := strings.IndexByte(rest, ':')
	if j < 0 || strings.HasPrefix(rest[j+1:], "#") {
		return "", false
	}
	return rest[j+1:], true
}

// KeyRule returns a limit key's rule segment: "<prefix>:{tag}:<rule>:…".
func KeyRule(key string) string {
	i := strings.Index(key, "}:")
	if i < 0 {
		return ""
	}
	rest := key[i+2:]
	if j := strings.IndexByte(rest, ':'); j >= 0 {
		return rest[:j]
	}
	return rest
}

// Book is what a sidecar knows of the fleet's bans in force, by key, within
// a bound, and decides how it follows the fleet's list (see the package
// doc). Book is safe for concurrent use; it applies nothing itself: its
// caller applies what each method returns.
type Book struct {
	max int

	// mu guards held.
	mu   sync.Mutex
	held map[string]time.Time // a ban's end, by key
}

// NewBook returns a Book that remembers at most max bans (max > 0).
func NewBook(max int) *Book { return &Book{max: max, held: make(map[string]time.Time)} }

// Learn records a ban of key until until, at now (within the bound; a ban
// beyond it is still to be applied, not remembered). known reports whether
// a ban of key in force was held; apply whether the ban is to be applied
// (it is not the one in force already).
func (b *Book) Learn(key string, until, now time.Time) (known, apply bool) {
	b.mu.Lock()
	old, ok := b.held[key]
	known = ok && old.After(now)
	if ok || len(b.held) < b.max || b.pruneLocked(now) {
		b.held[key] = until
	}
	b.mu.Unlock()
	return known, !known || !old.Equal(until)
}

// Forget drops key's ban (it was lifted); it reports whether a ban in force
// at now was held.
func (b *Book) Forget(key string, now time.Time) bool {
	b.mu.Lock()
	until, ok := b.held[key]
	delete(b.held, key)
	b.mu.Unlock()
	return ok && until.After(now)
}

// Outlasts returns the end of the ban held for key when it outlasts a ban
// raised by's way until until: a count that raised a ban ending sooner
// than the one held means Redis lost the held one, whose end stands (and is
// to be written back). A ban by hand replaces the held one, shorter too.
func (b *Book) Outlasts(key string, until time.Time, by Origin) (held time.Time, ok bool) {
	if by == ByHand {
		return time.Time{}, false
	}
	b.mu.Lock()
	held, ok = b.held[key]
	b.mu.Unlock()
	return held, ok && held.After(until)
}

// Reconcile compares the bans held with the fleet's list in force at now.
// When lost (Redis lost its list since the last reconcile), the bans held
// that the list lacks or ends sooner are to be written back (restore);
// otherwise the ones it lacks were lifted meanwhile and are forgotten here
// (lift). learn is the list's bans to learn: all of them, but those a
// restore writes back.
func (b *Book) Reconcile(list []Entry, lost bool, now time.Time) (restore, lift, learn []Entry) {
	indexed := make(map[string]time.Time, len(list))
	for _, e := range list {
		indexed[e.Key] = e.Until
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pruneLocked(now)
	var missing []Entry
	for k, until := range b.held {
		if in, ok := indexed[k]; !ok || lost && in.Before(until) {
			missing = append(missing, Entry{Key: k, Until: until})
		}
	}
	if lost {
		restore = missing
	} else {
		lift = missing
		for _, e := range missing {
			delete(b.held, e.Key)
		}
	}
	for _, e := range list {
		if lost && b.held[e.Key].After(e.Until) {
			continue // restored
		}
		learn = append(learn, e)
	}
	return restore, lift, learn
}

// InForce calls fn with the number of bans in force at now, per rule
// segment of their keys.
func (b *Book) InForce(now time.Time, fn func(rule string, n int)) {
	counts := make(map[string]int)
	b.mu.Lock()
	for k, until := range b.held {
		if until.After(now) {
			counts[KeyRule(k)]++
		}
	}
	b.mu.Unlock()
	for r, n := range counts {
		fn(r, n)
	}
}

// pruneLocked forgets the bans that ended; it reports whether room was
// made.
func (b *Book) pruneLocked(now time.Time) bool {
	n := len(b.held)
	for k, until := range b.held {
		if !until.After(now) {
			delete(b.held, k)
		}
	}
	return len(b.held) < n
}
