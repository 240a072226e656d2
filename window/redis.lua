-- flashgate sliding-window log: check, and add only if every enforcing key is under.
--
-- KEYS[i]: one sorted set per hit; member = request id, score = admission time in µs.
-- ARGV[1]: the request's member id.
-- ARGV[2]: now in µs as a decimal string, or "" to take it from Redis TIME.
-- ARGV[3*i], ARGV[3*i+1], ARGV[3*i+2]: key i's limit, window in µs, shadow ("1" or "0").
--
-- Reply: { now (µs, decimal string), then per key: count, over (1/0), retry-after (µs) }.
-- count: entries in the window after the decision. over: the window was full before this request
-- (so nothing was added to it). retry-after: when over, µs until the entry that must leave ages out.
--
-- Idempotent: a key that already holds the member is counted as admitted and not added again, so a
-- retried script never records a request twice. A denied request is recorded in no key (a member
-- left by an earlier attempt is removed).
--
-- Cost: a key with no entries (most keys under uniform load) takes ZCARD, ZADD and PEXPIRE; only a
-- key that has entries is trimmed (ZREMRANGEBYSCORE, whose reply corrects the count), so a steady key
-- still holds only its live entries.
--
-- Scores and bounds are formatted with %.0f: microsecond timestamps (~1.7e15) are exact in a double
-- but Lua 5.1's tostring (%.14g) would round them.
local member = ARGV[1]
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[2])
end
local nows = string.format('%.0f', now)

local n = #KEYS
local cards, states, retries = {}, {}, {}
local deny = false
for i = 1, n do
  local key = KEYS[i]
  local limit = tonumber(ARGV[3 * i])
  local window = tonumber(ARGV[3 * i + 1])
  local card = redis.call('ZCARD', key)
  if card > 0 then
    card = card - redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', now - window))
  end
  local state, retry = 1, 0 -- 1: under, add; 2: already holds member; 0: over
  if card > 0 and redis.call('ZSCORE', key, member) then
    state = 2
  elseif card >= limit then
    state = 0
    local e = redis.call('ZRANGE', key, card - limit, card - limit, 'WITHSCORES')
    retry = tonumber(e[2]) + window - now
    if ARGV[3 * i + 2] ~= '1' then
      deny = true
    end
  end
  cards[i], states[i], retries[i] = card, state, retry
end

local out = { nows }
for i = 1, n do
  local key = KEYS[i]
  local count, state = cards[i], states[i]
  if state == 1 and not deny then
    redis.call('ZADD', key, nows, member)
    redis.call('PEXPIRE', key, string.format('%.0f', math.ceil(tonumber(ARGV[3 * i + 1]) / 1000)))
    count = count + 1
  elseif state == 2 and deny then
    redis.call('ZREM', key, member)
    count = count - 1
  end
  local over = 0
  if state == 0 then
    over = 1
  end
  out[#out + 1] = count
  out[#out + 1] = over
  out[#out + 1] = retries[i]
end
return out
