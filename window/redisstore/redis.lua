-- flashgate sliding-window log: decide requests in order, each all or nothing over its keys.
--
-- One call decides one request, or a batch of them (the auto-pipeline sends every request that
-- queued behind a round trip as one call). Per request, in order:
--   ARGV: member id (not empty and not beginning with "\0", which marks a bucketed key's
--         counters and width: Go refuses such an id); now in µs as a decimal string, or "" for
--         Redis TIME (read once per call); n, the request's key count; then per key one spec:
--         21 bytes, struct.pack('<I4I8I4BI4') of limit, window (µs), cost, shadow (1/0) and
--         buckets (0: an exact log; B ≥ 1: B sub-window counters), followed by an exact key's
--         lifetime in ms, ceil(window / 1000), in decimal (Go's appendHitArgs writes it).
--   KEYS: the request's n keys, one sorted set each.
-- Reply, per request: now (µs, a decimal string), then per key: count, then retry-after or reset.
--   count: entries in the window after the decision. Then, when the window had no room for the
--   request's cost (nothing was added), the retry-after: µs until enough entries age out for the
--   cost to fit, at least 1 (the whole window if the cost exceeds the limit). When it had room,
--   the reset of an admitted request, negated: minus µs until the key's oldest counted entry (a
--   bucketed key: sub-window) leaves the window; 0 where the key held nothing before the request
--   (its reset is the window, which the caller knows), and for every key of a denied request.
--
-- Exact log (buckets 0): member = request id, score = admission µs. A request of cost c is c
-- entries: its member, then member.."#2" … member.."#c".
--
-- Bucketed (buckets B): the same sorted set holds, with scores below SPLIT, one counter per
-- sub-window of width ceil(window / B) µs (member "\0" followed by the sub-window's index,
-- floor(µs / width), in decimal; score = its count) and the width itself (member "\0w"); with
-- scores above SPLIT, the member ids of the requests admitted in the last min(HORIZON, window),
-- one per request whatever its cost, scored by admission µs (for idempotency). The count is
-- the sum of the counters of every sub-window that overlaps (now - window, now], the oldest
-- one whole. A key that holds exact entries and no width (the rule was exact before a reload)
-- is converted: its entries become counters. A key whose width differs (the rule's window or
-- B changed) moves each counter to the new sub-window that holds its old one's last instant.
-- An exact hit on a key that holds a width (the rule was bucketed before a reload, or another
-- rule or override with the same key is) converts it back: each counter becomes entries at its
-- sub-window's end (at the latest now), the newest `limit` of them, its member ids among them.
-- A key hit twice in one request is loaded (and converted) once, by its first hit: it keeps that
-- hit's kind, width and window for the request, and the other hits compare their own limit and
-- cost with its count.
--
-- Idempotent: a retried call never records a request twice. Where there is room, ZADD NX adds
-- nothing that an earlier attempt added (bucketed: and then the counter is not incremented); a
-- full key that already holds the member counts it as admitted. A denied request is recorded
-- in no key (an earlier attempt's entries, or its counts, are removed).
--
-- Why it is written as it is: Redis 7.0 formats a Lua number given to a command with %.17g and
-- Lua parses a string with strtod, each dearer than a command's own work, so the spec is binary,
-- Redis TIME's reply is joined into now's decimal string, an exact key's scores and lifetime go
-- to Redis as the strings received, and now becomes a number only where a key has entries (its
-- trim bound then by %d); Lua's tostring (%.14g) would round µs and is never used. An exact key
-- with entries is read from its oldest entry, one score (Redis formats every score it replies),
-- which tells whether it holds counters (scores up to SPLIT), whether to trim, an admission's
-- reset and, when one entry must leave, the retry-after; only an admission whose oldest entry
-- has just left reads the next one, after the trim. A bucketed key's reset comes from the
-- counters it reads anyway. Every function and table the top level makes is made again on every
-- call, so the functions live in helpers() and buckets(), made by the first request that needs
-- them, and a one-key request is decided in place, with its fresh key's ZADD and PEXPIRE inline:
-- folding it into the several-keys loop or its key into the helpers costs a lone call measurably
-- more (BENCHMARKS.md, "Redis cost per check": the one-key path).

-- helpers returns the functions of every path but a one-key request's fresh exact key, made by
-- a call's first request that needs one. Its field B, the bucketed keys' functions, is made by
-- the call's first bucketed hit.
local function helpers()
  local h = {}
  local WIDTH = '\0w' -- a bucketed key's member holding its sub-window width

  -- buckets returns the functions of bucketed keys, made only by a call that has one.
  local function buckets()
    local SPLIT = 1000000000000 -- 1e12: scores at or below are counters and the width, above are µs
    local ABOVE = '(1000000000000'
    local HORIZON = 5000000 -- µs a bucketed key remembers the member ids it admitted

    -- bname is the member of sub-window idx's counter.
    local function bname(idx)
      return '\0' .. string.format('%d', idx)
    end

    -- bload reads a bucketed key: it converts what a reload left (exact entries, another width),
    -- trims the member ids past the horizon and the counters past the window, and returns the
    -- state: sum (the count), width, the live counters (idx -> count), the oldest live one's index
    -- (nil: none) and whether the width is stored.
    local function bload(key, now, window, nb)
      local width = math.ceil(window / nb)
      local rows = redis.call('ZRANGEBYSCORE', key, '-inf', SPLIT, 'WITHSCORES')
      local live, sum, stored = {}, 0, false
      local cut = math.floor((now - window) / width)
      local old, dead = nil, {}
      for j = 1, #rows, 2 do
        local m = rows[j]
        if m == WIDTH then
          old = tonumber(rows[j + 1])
        else
          live[tonumber(string.sub(m, 2))] = tonumber(rows[j + 1])
        end
      end
      if old == width then
        stored = true
      elseif old then
        -- Another width: each counter moves to the sub-window holding its old one's last instant.
        local moved, top = {}, math.floor(now / width)
        for idx, c in pairs(live) do
          dead[#dead + 1] = bname(idx)
          local to = math.min(math.floor(((idx + 1) * old - 1) / width), top)
          moved[to] = (moved[to] or 0) + c
        end
        live = moved
      else
        -- No width: exact entries (or nothing) are there; each entry in the window counts 1.
        local es = redis.call('ZRANGEBYSCORE', key, now - window + 1, '+inf', 'WITHSCORES')
        for j = 2, #es, 2 do
          local idx = math.floor(es[j] / width)
          live[idx] = (live[idx] or 0) + 1
        end
      end
      local first
      for idx, c in pairs(live) do
        if idx < cut then
          if stored then
            dead[#dead + 1] = bname(idx)
          end
          live[idx] = nil
        else
          sum = sum + c
          if not first or idx < first then
            first = idx
          end
        end
      end
      if #dead > 0 then
        redis.call('ZREM', key, unpack(dead))
      end
      if not stored and next(live) then
        -- Converted: write the counters and the width, and give them the key's lifetime.
        local args = { width, WIDTH }
        for idx, c in pairs(live) do
          args[#args + 1] = c
          args[#args + 1] = bname(idx)
        end
        redis.call('ZADD', key, unpack(args))
        redis.call('PEXPIRE', key, math.ceil((window + width) / 1000))
        stored = true
      end
      redis.call('ZREMRANGEBYSCORE', key, ABOVE, now - math.min(HORIZON, window))
      return { sum = sum, width = width, live = live, first = first, stored = stored }
    end

    -- bretry returns µs until enough counters of a full bucketed key have left for cost to fit.
    local function bretry(st, limit, cost, window, now)
      if cost > limit then
        return window
      end
      local idxs = {}
      for idx in pairs(st.live) do
        idxs[#idxs + 1] = idx
      end
      table.sort(idxs)
      local leave, gone = st.sum + cost - limit, 0
      for _, idx in ipairs(idxs) do
        gone = gone + st.live[idx]
        if gone >= leave then
          return math.max((idx + 1) * st.width + window - now, 1)
        end
      end
      return window
    end

    -- breset returns µs until the oldest live sub-window of a bucketed key leaves its window (an
    -- admission's reset), the window for none.
    local function breset(st, window, now)
      if not st.first then
        return window
      end
      return (st.first + 1) * st.width + window - now
    end

    -- badd records a request of cost in a bucketed key, unless an earlier attempt did; it returns
    -- what it added to the count.
    local function badd(key, st, now, member, cost, window)
      if redis.call('ZADD', key, 'NX', now, member) == 0 then
        return 0
      end
      local idx = math.floor(now / st.width)
      if not st.first or idx < st.first then
        st.first = idx
      end
      redis.call('ZINCRBY', key, cost, bname(idx))
      if not st.stored then
        redis.call('ZADD', key, st.width, WIDTH)
      end
      redis.call('PEXPIRE', key, math.ceil((window + st.width) / 1000))
      return cost
    end

    -- bremove takes back what an earlier attempt of member recorded in a bucketed key; it returns
    -- what it took off the count.
    local function bremove(key, width, member, cost)
      local at = redis.call('ZSCORE', key, member)
      if not at or redis.call('ZREM', key, member) == 0 then
        return 0
      end
      local name = bname(math.floor(at / width))
      if tonumber(redis.call('ZINCRBY', key, -cost, name)) <= 0 then
        redis.call('ZREM', key, name)
      end
      return cost
    end
    -- bexact converts a bucketed key (it holds a width) into an exact log for a hit of limit
    -- and window, as Memory does: each counter becomes entries at its sub-window's end (at the
    -- latest now: never earlier than the admissions it counts), the newest limit of them. The
    -- member ids of a sub-window are some of its entries (rescored), so that a retry is still
    -- counted once; the others get fresh names. It returns the count.
    local function bexact(key, now, window, limit)
      local rows = redis.call('ZRANGEBYSCORE', key, '-inf', SPLIT, 'WITHSCORES')
      local ids = redis.call('ZRANGEBYSCORE', key, ABOVE, '+inf', 'WITHSCORES')
      redis.call('DEL', key)
      local old, cs, skip = nil, {}, -limit
      for j = 1, #rows, 2 do
        if rows[j] == WIDTH then
          old = tonumber(rows[j + 1])
        else
          local idx = tonumber(string.sub(rows[j], 2))
          if idx then
            cs[#cs + 1] = { idx, tonumber(rows[j + 1]) }
            skip = skip + cs[#cs][2]
          end
        end
      end
      local mine, kept = {}, {} -- sub-window -> its ids; the ids kept
      if old then
        for j = 1, #ids, 2 do
          local idx = math.floor(tonumber(ids[j + 1]) / old)
          mine[idx] = mine[idx] or {}
          table.insert(mine[idx], ids[j])
        end
      end
      table.sort(cs, function(x, y) return x[1] < y[1] end)
      local todo = {} -- { at, n, idx }
      for _, c in ipairs(cs) do
        local n, at = c[2], now
        if skip > 0 then
          local d = math.min(skip, n)
          skip, n = skip - d, n - d
        end
        if old then
          at = math.min((c[1] + 1) * old, now)
        end
        if n > 0 and at > now - window then
          todo[#todo + 1] = { at, n, c[1] }
          for j = 1, math.min(n, #(mine[c[1]] or {})) do
            kept[mine[c[1]][j]] = true
          end
        end
      end
      local card, args, seq = 0, {}, 0
      for _, t in ipairs(todo) do
        local m = mine[t[3]] or {}
        for j = 1, t[2] do
          local name = m[j]
          if not name then
            repeat
              seq = seq + 1
              name = '\0e' .. string.format('%d', now) .. '.' .. seq
            until not kept[name]
          end
          args[#args + 1] = t[1]
          args[#args + 1] = name
          if #args >= 1000 then
            card = card + redis.call('ZADD', key, unpack(args))
            args = {}
          end
        end
      end
      if #args > 0 then
        card = card + redis.call('ZADD', key, unpack(args))
      end
      if card > 0 then
        redis.call('PEXPIRE', key, math.ceil(window / 1000))
      end
      return card
    end
    return { load = bload, retry = bretry, reset = breset, add = badd, remove = bremove, exact = bexact }
  end

  -- add records a request of cost in an exact key at score at (the decimal string of now), unless
  -- an earlier attempt did; it returns the entries it added.
  local function add(key, at, member, cost)
    if cost == 1 then
      return redis.call('ZADD', key, 'NX', at, member)
    end
    local added, args = 0, { 'NX', at, member }
    for j = 2, cost do
      args[#args + 1] = at
      args[#args + 1] = member .. '#' .. j
      if #args >= 1000 or j == cost then
        added = added + redis.call('ZADD', key, unpack(args))
        args = { 'NX' }
      end
    end
    return added
  end

  local function remove(key, member, cost)
    if cost == 1 then
      return redis.call('ZREM', key, member)
    end
    local removed, args = 0, { member }
    for j = 2, cost do
      args[#args + 1] = member .. '#' .. j
      if #args >= 1000 or j == cost then
        removed = removed + redis.call('ZREM', key, unpack(args))
        args = {}
      end
    end
    return removed
  end

  -- retry returns µs until the entries of a full key have aged out far enough for cost to fit
  -- (at least 1: a retry-after of 0 means room). oldest is the oldest entry's score if read.
  local function retry(key, card, limit, cost, window, now, oldest)
    local leave = card + cost - limit -- entries that must age out
    if leave > card then
      return window
    end
    if leave == 1 and oldest then
      return math.max(oldest + window - now, 1)
    end
    local r = leave == 1 and '0' or leave - 1 -- a number is formatted with %.17g, a string is not
    -- (leave is 1 where one entry must leave: the common case)
    local e = redis.call('ZRANGE', key, r, r, 'WITHSCORES')
    return math.max(e[2] + window - now, 1)
  end

  -- exact converts a bucketed key back into an exact log for a hit of limit and window (see
  -- bexact) and returns its count.
  local function exact(key, now, window, limit)
    h.B = h.B or buckets()
    return h.B.exact(key, now, window, limit)
  end

  -- load counts key's window for one hit: an exact log (nb 0) holding card entries, read from its
  -- oldest entry as a one-key request's key is (a bucketed key met by an exact hit is converted
  -- back, a key whose oldest entry left is trimmed), returning the count, false and the oldest
  -- entry's score where it was read and is in the window; or (nb = B) its sub-window counters,
  -- returned as st.
  local function load(key, now, window, limit, nb, card)
    if nb == 0 then
      if card == 0 then
        return 0, false
      end
      local oldest = tonumber(redis.call('ZRANGE', key, '0', '0', 'WITHSCORES')[2])
      if oldest <= 1000000000000 then
        return exact(key, now, window, limit), false
      elseif oldest <= now - window then
        return card - redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - window)), false
      end
      return card, false, oldest
    end
    h.B = h.B or buckets()
    local st = h.B.load(key, now, window, nb)
    return st.sum, st
  end

  -- reset returns an admission's reset on a key as the reply carries it (see the top): minus µs
  -- until its oldest counted entry (bucketed, st: sub-window) leaves the window, or 0 for an
  -- exact key that held nothing (card 0).
  local function reset(key, st, card, window, now)
    if st then
      return -h.B.reset(st, window, now)
    elseif card == 0 then
      return 0
    end
    return now - window - tonumber(redis.call('ZRANGE', key, '0', '0', 'WITHSCORES')[2])
  end
  h.add, h.remove, h.retry, h.exact, h.load, h.reset = add, remove, retry, exact, load, reset
  return h
end

-- spec reads a hit's spec (see the top): limit, window, cost, buckets, an exact key's lifetime in
-- ms as the string PEXPIRE takes, and shadow (last: a one-key request has no use for it).
local function spec(s)
  if #s < 22 or not string.find(s, '^%d+$', 22) then
    return error('flashgate: a hit spec is not 21 bytes of struct <I4I8I4BI4 and a lifetime in ms (' .. #s .. ' bytes)')
  end
  local limit, window, cost, shadow, nb = struct.unpack('<I4I8I4BI4', s)
  if shadow > 1 or limit < 1 or window < 1 then
    return error('flashgate: a hit spec has shadow ' .. shadow .. ', limit ' .. limit .. ', window ' .. window)
  end
  return limit, window, cost, nb, string.sub(s, 22), shadow
end

-- Globals read once: each read of a global is a table lookup, several per request.
local call, argv, keys = redis.call, ARGV, KEYS
local H     -- helpers(), once a request needs them
local clock -- Redis TIME: now in µs as a decimal string
-- The last now made a number, and that number: a call's requests mostly share one (Redis TIME's).
local lastnow, lastn
-- The last spec a one-key request read, and its fields: a batch's one-key requests mostly share
-- one (Lua's strings are interned: comparing two is comparing pointers).
local ls, llimit, lwindow, lcost, lnb, lttl
local out, o = { false, false, false }, 0 -- sized for a lone one-key request
local a, k = 1, 0
local nargv = #argv
-- The several-keys path's scratch tables, made by its first request with room for four hits (a
-- table grown one index at a time is rehashed at 1, 2 and 4), and per hit position the spec last
-- read there and its fields: a batch's requests mostly come from one rule set.
local cards, states, retries, bstates, windows, costs, ttls, specs, fields
while a <= nargv do
  local member, nows, n = argv[a], argv[a + 1], argv[a + 2]
  a = a + 3
  if nows == '' then
    if not clock then
      -- seconds and µs joined as decimal strings: no arithmetic, no format
      local t = call('TIME')
      clock = t[1] .. string.sub('00000', #t[2]) .. t[2]
    end
    nows = clock
  end
  o = o + 1
  out[o] = nows

  if n == '1' then
    -- One key, the common case: decided in place.
    k = k + 1
    local key, s = keys[k], argv[a]
    a = a + 1
    if s ~= ls then
      ls, llimit, lwindow, lcost, lnb, lttl = s, spec(s)
    end
    local limit, window, cost, nb, ttl = llimit, lwindow, lcost, lnb, lttl
    local card, wait = 0, 0
    -- An exact key is counted (ZCARD; 0: a fresh key, most of a uniform load's: nothing to trim,
    -- and now stays a string). One with entries is then read from its oldest entry (ZRANGE): its
    -- score tells whether the key holds sub-window counters (scores up to 1e12, SPLIT in
    -- buckets()), whether entries left the window (then the key is trimmed, and an admission reads
    -- the new oldest entry for its reset) or none did; then it gives an admission's reset and,
    -- when one entry must leave for the cost to fit, a denial's retry-after.
    if nb == 0 then
      card = call('ZCARD', key)
      local now, oldest -- now as a number; the oldest entry's score, where read and in the window
      if card > 0 then
        if nows ~= lastnow then
          lastnow, lastn = nows, tonumber(nows)
        end
        now = lastn
        oldest = tonumber(call('ZRANGE', key, '0', '0', 'WITHSCORES')[2])
        if oldest <= 1000000000000 then
          H = H or helpers()
          card, oldest = H.exact(key, now, window, limit), nil -- converted from counters
        elseif oldest <= now - window then
          card = card - call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - window))
          oldest = nil -- left the window
        end
      end
      -- Cost 1 inline, here and in the several-keys path: most calls need only ZADD and PEXPIRE,
      -- and no helpers (see the top).
      if card + cost <= limit then
        if card > 0 then
          wait = now - window - (oldest or tonumber(call('ZRANGE', key, '0', '0', 'WITHSCORES')[2]))
        end
        if cost == 1 then
          card = card + call('ZADD', key, 'NX', nows, member)
        else
          H = H or helpers()
          card = card + H.add(key, nows, member, cost)
        end
        call('PEXPIRE', key, ttl)
      elseif card == 0 then
        wait = window -- the cost is above the limit
      elseif not call('ZSCORE', key, member) then
        if oldest and card + cost - limit == 1 then
          wait = math.max(oldest + window - now, 1)
        else
          H = H or helpers()
          wait = H.retry(key, card, limit, cost, window, now)
        end
      else
        -- Full, and an earlier attempt admitted the request: its reset.
        wait = now - window - (oldest or tonumber(call('ZRANGE', key, '0', '0', 'WITHSCORES')[2]))
      end
    else
      -- A bucketed key.
      H = H or helpers()
      if nows ~= lastnow then
        lastnow, lastn = nows, tonumber(nows)
      end
      local now = lastn
      local st
      card, st = H.load(key, now, window, limit, nb)
      if card + cost <= limit then
        card = card + H.B.add(key, st, now, member, cost, window)
        wait = -H.B.reset(st, window, now)
      elseif card == 0 or not call('ZSCORE', key, member) then
        wait = H.B.retry(st, limit, cost, window, now)
      else
        wait = -H.B.reset(st, window, now) -- an earlier attempt admitted it
      end
    end
    out[o + 1], out[o + 2] = card, wait
    o = o + 2
  else
    -- Several keys: count every key first, then add to all or to none.
    n = tonumber(n)
    if not cards then
      local f = false -- a table constructor with four values sizes its array for four
      cards, states, retries, bstates = { f, f, f, f }, { f, f, f, f }, { f, f, f, f }, { f, f, f, f }
      windows, costs, ttls = { f, f, f, f }, { f, f, f, f }, { f, f, f, f }
      specs, fields = { f, f, f, f }, { f, f, f, f }
    end
    -- now as a number, and the helpers, where a key needs them: a fresh exact key of cost 1
    -- needs neither (ZCARD, ZADD, PEXPIRE).
    local now
    local deny = false
    for i = 1, n do
      local key, s = keys[k + i], argv[a + i - 1]
      local sp = fields[i]
      if specs[i] ~= s then
        sp = { spec(s) }
        specs[i], fields[i] = s, sp
      end
      local limit, window, cost, nb, ttl, shadow = sp[1], sp[2], sp[3], sp[4], sp[5], sp[6]
      costs[i], ttls[i] = cost, ttl
      local card, st, oldest
      local first = 0 -- the same key earlier in this request: loaded once, by its first hit
      for j = 1, i - 1 do
        if keys[k + j] == key then
          first = j
          break
        end
      end
      if first > 0 then
        card, st, window = cards[first], bstates[first], windows[first]
      else
        card = nb == 0 and call('ZCARD', key) or 0
        if nb > 0 or card > 0 then
          if nows ~= lastnow then
            lastnow, lastn = nows, tonumber(nows)
          end
          now, H = lastn, H or helpers()
          card, st, oldest = H.load(key, now, window, limit, nb, card)
        end
      end
      -- wait is the key's reply: retry-after (over), or minus the reset where the oldest entry is
      -- known (the second loop finds the others').
      local state, wait = 1, 0 -- 1: room, add; 2: full, already holds the member; 0: over
      if card + cost > limit then
        if card > 0 and call('ZSCORE', key, member) then
          state = 2
        else
          if nows ~= lastnow then
            lastnow, lastn = nows, tonumber(nows)
          end
          now, H = lastn, H or helpers()
          if st then
            wait = H.B.retry(st, limit, cost, window, now)
          else
            wait = H.retry(key, card, limit, cost, window, now, oldest)
          end
          state = 0
          if shadow ~= 1 then
            deny = true
          end
        end
      end
      if state ~= 0 and oldest then
        wait = now - window - oldest
      end
      cards[i], states[i], retries[i], bstates[i], windows[i] = card, state, wait, st or false, window
    end
    for i = 1, n do
      local key = keys[k + i]
      local window, cost = windows[i], costs[i]
      local card, state, wait = cards[i], states[i], retries[i]
      local dup = 0 -- the same key earlier in this request: it counts once
      for j = 1, i - 1 do
        if keys[k + j] == key then
          dup = j
          break
        end
      end
      -- A key hit again later in this request counts once, at its largest cost; where any of its
      -- hits is over, nothing is added (a shadow one: a full window is reported, not grown).
      local over = false
      if dup == 0 then
        for j = i + 1, n do
          if keys[k + j] == key then
            cost = math.max(cost, costs[j])
            over = over or states[j] == 0
          end
        end
      end
      if dup > 0 then
        card = cards[dup]
      elseif deny then
        if state == 2 or (state == 1 and card > 0) then
          H = H or helpers()
          local st = bstates[i]
          if st then
            card = card - H.B.remove(key, st.width, member, cost)
          else
            card = card - H.remove(key, member, cost)
          end
        end
      elseif state == 1 and not over then
        local st = bstates[i]
        if st then
          card = card + H.B.add(key, st, now, member, cost, window)
        else
          -- window is this hit's own (it is the key's first): its spec's lifetime.
          if cost == 1 then
            card = card + call('ZADD', key, 'NX', nows, member)
          else
            H = H or helpers()
            card = card + H.add(key, nows, member, cost)
          end
          call('PEXPIRE', key, ttls[i])
        end
      end
      -- The reply of a key with room: no reset for a denied request; else, where the first loop did
      -- not know it, the key's first hit's, or (a fresh key's is 0, the first over) its own.
      if state ~= 0 then
        if deny then
          wait = 0
        elseif dup > 0 and retries[dup] <= 0 then
          wait = retries[dup]
        elseif wait == 0 and (bstates[i] or cards[i] > 0) then
          wait = H.reset(key, bstates[i], cards[i], window, now)
        end
      end
      cards[i], retries[i] = card, wait
      out[o + 1], out[o + 2] = card, wait
      o = o + 2
    end
    a = a + n
    k = k + n
  end
end
return out
