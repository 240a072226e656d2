-- flashgate sliding-window log: decide requests in order, each all or nothing over its keys.
--
-- One call decides one request, or a batch of them (the auto-pipeline sends every request that
-- queued behind a round trip as one call). Per request, in order:
--   ARGV: member id; now in µs as a decimal string, or "" for Redis TIME (read once per call);
--         n, the request's key count; then per key: limit, window in µs, cost, shadow ("1" or "0").
--   KEYS: the request's n keys, one sorted set each: member = request id, score = admission µs.
-- Reply, per request: now (µs), then per key: count, over (1/0), retry-after (µs).
--   count: entries in the window after the decision. over: the window had no room for the
--   request's cost before it (so nothing was added). retry-after: when over, µs until enough
--   entries age out for the cost to fit (the whole window if the cost exceeds the limit).
--
-- A request of cost c is c entries: its member, then member.."#2" … member.."#c".
--
-- Idempotent: a retried call never records a request twice. Where there is room, ZADD NX adds
-- nothing that an earlier attempt added; a full key that already holds the member counts it as
-- admitted. A denied request is recorded in no key (an earlier attempt's entries are removed).
--
-- Cost: a key with no entries takes ZCARD, ZADD and PEXPIRE; a key with entries is trimmed too
-- (ZREMRANGEBYSCORE, whose reply corrects the count). ZSCORE runs only where a key is full.
-- Numbers go to redis.call as numbers: Redis formats them with %.17g, exact for µs timestamps
-- (only Lua's own tostring, %.14g, would round them).

local function add(key, now, member, cost)
  if cost == 1 then
    return redis.call('ZADD', key, 'NX', now, member)
  end
  local added, args = 0, { 'NX', now, member }
  for j = 2, cost do
    args[#args + 1] = now
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

-- retry returns µs until the entries of a full key have aged out far enough for cost to fit.
local function retry(key, card, limit, cost, window, now)
  local leave = card + cost - limit -- entries that must age out
  if leave > card then
    return window
  end
  local e = redis.call('ZRANGE', key, leave - 1, leave - 1, 'WITHSCORES')
  return e[2] + window - now
end

local clock
local out, o = {}, 0
local a, k = 1, 0
local nargv = #ARGV
local cards, states, retries = {}, {}, {}
while a <= nargv do
  local member, now, n = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
  a = a + 3
  if now == '' then
    if not clock then
      local t = redis.call('TIME')
      clock = t[1] * 1000000 + t[2]
    end
    now = clock
  else
    now = tonumber(now)
  end
  o = o + 1
  out[o] = now

  if n == 1 then
    -- One key, the common case: decided in place.
    k = k + 1
    local key = KEYS[k]
    local limit, window, cost = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    a = a + 4
    local card = redis.call('ZCARD', key)
    if card > 0 then
      card = card - redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
    end
    local over, wait = 0, 0
    if card + cost <= limit then
      card = card + add(key, now, member, cost)
      redis.call('PEXPIRE', key, math.ceil(window / 1000))
    elseif card == 0 or not redis.call('ZSCORE', key, member) then
      over, wait = 1, retry(key, card, limit, cost, window, now)
    end
    out[o + 1], out[o + 2], out[o + 3] = card, over, wait
    o = o + 3
  else
    -- Several keys: count every key first, then add to all or to none.
    local deny = false
    local first = a
    for i = 1, n do
      local key = KEYS[k + i]
      local limit, window, cost = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
      local card = redis.call('ZCARD', key)
      if card > 0 then
        card = card - redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
      end
      local state, wait = 1, 0 -- 1: room, add; 2: full, already holds the member; 0: over
      if card + cost > limit then
        if card > 0 and redis.call('ZSCORE', key, member) then
          state = 2
        else
          state, wait = 0, retry(key, card, limit, cost, window, now)
          if ARGV[a + 3] ~= '1' then
            deny = true
          end
        end
      end
      cards[i], states[i], retries[i] = card, state, wait
      a = a + 4
    end
    a = first
    for i = 1, n do
      local key = KEYS[k + i]
      local window, cost = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
      local card, state = cards[i], states[i]
      local dup = 0 -- the same key earlier in this request: it counts once
      for j = 1, i - 1 do
        if KEYS[k + j] == key then
          dup = j
          break
        end
      end
      if dup > 0 then
        card = cards[dup]
      elseif deny then
        if state == 2 or (state == 1 and card > 0) then
          card = card - remove(key, member, cost)
        end
      elseif state == 1 then
        card = card + add(key, now, member, cost)
        redis.call('PEXPIRE', key, math.ceil(window / 1000))
      end
      cards[i] = card
      local over = 0
      if state == 0 then
        over = 1
      end
      out[o + 1], out[o + 2], out[o + 3] = card, over, retries[i]
      o = o + 3
      a = a + 4
    end
    k = k + n
  end
end
return out
