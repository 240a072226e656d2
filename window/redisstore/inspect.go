package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/flashgate/flashgate/window"
)

// WindowState is what [Inspect] reads of one key's window at one instant.
type WindowState struct {
	// Now is the instant read (Redis TIME).
	Now time.Time
	// Count is the requests the window holds: what the next check counts
	// before adding its own.
	Count int
	// Oldest and Newest are the oldest and newest admissions counted; zero
	// when Count is 0. A bucketed key knows them to its sub-window: Oldest
	// is the start of the oldest counted sub-window (it may lie before
	// Now-Window: that sub-window is counted whole), Newest the newest
	// admission it remembers the member id of, else its newest sub-window's
	// end.
	Oldest, Newest time.Time
	// AdmitsAt is when a request of cost 1 fits: Now when the window has
	// room.
	AdmitsAt time.Time
	// Bucketed: the key holds sub-window counters (see window.Limit).
	Bucketed bool
	// Leases are the running leases' slots the window counts: reserved by
	// sidecars and scored at their leases' ends, after Now (a slot's use
	// is not recorded: a lease's slots are held until it ends or returns
	// them). Oldest lease end first; none for a bucketed key.
	Leases []LeaseSlots
}

// LeaseSlots is one lease's slots in a key's window.
type LeaseSlots struct {
	// Sidecar is the reserving store's id (see [Redis.ID]); Lease the
	// lease's id without its first byte, 0x02 (its members are 0x02,
	// Lease, then #1 … #n).
	Sidecar, Lease string
	// Slots still in the window, and the lease's end: their score.
	Slots int
	Ends  time.Time
}

// Full reports whether the window had no room for one more request at Now.
func (s WindowState) Full() bool { return s.AdmitsAt.After(s.Now) }

// Inspect reads key's window as a check of limit would count it, without
// changing it: a read-only script, so it may run on any Redis the store
// uses. A key holding sub-window counters is read as bucketed with the
// width it holds, whatever limit.Buckets says (the next check of a
// different layout converts it, see doc.go); an exact key is read as an
// exact log. A missing key is an empty window.
func Inspect(ctx context.Context, client Client, key string, limit window.Limit) (WindowState, error) {
	if key == "" {
		return WindowState{}, errors.New("inspect: empty key")
	}
	if err := limit.Validate(); err != nil {
		return WindowState{}, fmt.Errorf("inspect %s: %w", key, err)
	}
	res, err := inspectScript.eval(ctx, client, []string{key}, []any{limit.Window.Microseconds(), limit.Requests})
	if err != nil {
		return WindowState{}, fmt.Errorf("inspect %s: %w", key, err)
	}
	if len(res) < 6 || (len(res)-6)%3 != 0 {
		return WindowState{}, fmt.Errorf("inspect %s: script replied %d values, want 6 and a triple per lease", key, len(res))
	}
	var v [6]int64
	for i := range v {
		n, ok := res[i].(int64)
		if !ok {
			return WindowState{}, fmt.Errorf("inspect %s: script replied %T at %d, want an integer", key, res[i], i)
		}
		v[i] = n
	}
	at := func(us int64) time.Time {
		if us == 0 {
			return time.Time{}
		}
		return time.UnixMicro(us)
	}
	st := WindowState{Now: at(v[0]), Count: int(v[1]), Oldest: at(v[2]), Newest: at(v[3]), AdmitsAt: at(v[4]), Bucketed: v[5] == 1}
	for j := 6; j < len(res); j += 3 {
		id, _ := res[j].(string)
		n, ok1 := res[j+1].(int64)
		end, ok2 := res[j+2].(int64)
		if len(id) < storeIDLen || !ok1 || !ok2 {
			return WindowState{}, fmt.Errorf("inspect %s: lease %d: script replied %q, %T, %T", key, (j-6)/3, truncID(id), res[j+1], res[j+2])
		}
		st.Leases = append(st.Leases, LeaseSlots{Sidecar: id[:storeIDLen], Lease: id, Slots: int(n), Ends: at(end)})
	}
	slices.SortStableFunc(st.Leases, func(a, b LeaseSlots) int { return a.Ends.Compare(b.Ends) })
	return st, nil
}

// inspectScript is shared by every Inspect call: its SHA-1 is computed once.
var inspectScript = newScript(inspectLua)

// inspectLua reads one key's window as redis.lua counts it, writing nothing.
//
//	KEYS[1]: the key. ARGV[1]: the window (µs); ARGV[2]: the limit.
//	Reply: now, count, oldest, newest, admits-at (µs; 0: none), bucketed (1/0),
//	then for each lease with slots scored after now (members "\x02" id "#" j,
//	see lease.lua): its id, its slots, their score.
const inspectLua = `local key = KEYS[1]
local window, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local SPLIT = 1000000000000
local width = redis.call('ZSCORE', key, '\0w')
if not width then
  local from = '(' .. string.format('%d', now - window)
  local count = redis.call('ZCOUNT', key, from, '+inf')
  if count == 0 then
    return { now, 0, 0, 0, now, 0 }
  end
  local oldest = redis.call('ZRANGEBYSCORE', key, from, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  local newest = redis.call('ZREVRANGEBYSCORE', key, '+inf', from, 'WITHSCORES', 'LIMIT', 0, 1)
  local admits = now
  if count >= limit then
    local e = redis.call('ZRANGEBYSCORE', key, from, '+inf', 'WITHSCORES', 'LIMIT', count - limit, 1)
    admits = tonumber(e[2]) + window
  end
  local out = { now, count, tonumber(oldest[2]), tonumber(newest[2]), admits, 0 }
  local held, at = redis.call('ZRANGEBYSCORE', key, '(' .. string.format('%d', now), '+inf', 'WITHSCORES'), {}
  for j = 1, #held, 2 do
    local id = string.match(held[j], '^\2([^#]+)#')
    if id then
      if not at[id] then
        out[#out + 1], out[#out + 2], out[#out + 3] = id, 0, tonumber(held[j + 1])
        at[id] = #out - 1
      end
      out[at[id]] = out[at[id]] + 1
    end
  end
  return out
end
width = tonumber(width)
local cut = math.floor((now - window) / width)
local rows = redis.call('ZRANGEBYSCORE', key, '-inf', SPLIT, 'WITHSCORES')
local idxs, live, sum = {}, {}, 0
for j = 1, #rows, 2 do
  local idx = tonumber(string.sub(rows[j], 2))
  if rows[j] ~= '\0w' and idx and idx >= cut then
    local c = tonumber(rows[j + 1])
    idxs[#idxs + 1], live[idx], sum = idx, c, sum + c
  end
end
if sum == 0 then
  return { now, 0, 0, 0, now, 1 }
end
table.sort(idxs)
local newest = redis.call('ZREVRANGEBYSCORE', key, '+inf', '(' .. SPLIT, 'WITHSCORES', 'LIMIT', 0, 1)
local nw = tonumber(newest[2] or 0)
if nw <= now - window then
  nw = math.min((idxs[#idxs] + 1) * width - 1, now)
end
local admits = now
if sum + 1 > limit then
  local leave, gone = sum + 1 - limit, 0
  for _, idx in ipairs(idxs) do
    gone = gone + live[idx]
    if gone >= leave then
      admits = (idx + 1) * width + window
      break
    end
  end
end
return { now, sum, idxs[1] * width, nw, admits, 1 }`
