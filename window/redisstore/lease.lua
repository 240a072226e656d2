-- flashgate lease: reserve a batch of admissions in one exact key's window, return unused ones.
--
--   KEYS[1]: the key, an exact log (one entry per admission, see redis.lua).
--   ARGV: lease id; want (slots to reserve, 0 to only return); limit; window (µs); lease (µs);
--         now in µs as a decimal string, or "" for Redis TIME; back id, back from, back to: the
--         slots back..'#'..from … back..'#'..to of an earlier lease to return ("" for none); least,
--         the fewest slots worth a grant (1 to want).
--   KEYS[2], optional: the key's queue, in its hash slot: the score up to which the key's entries
--         make room for reservations refused before (a string, expiring once they have left).
-- Reply: now (µs, a decimal string); granted; the key's count after the call; when nothing was
--   granted, µs until least more entries fit (at least 1), else 0; the slots returned.
--
-- A refused reservation is told when least fits beyond the room already promised to the callers
-- refused before it (the entries up to the queue's score), and moves the queue's score to the
-- entry it waits for: in a full window the refused sidecars come back one lump of room each,
-- not all at the instant the oldest lump leaves. The queue only orders retries; grants count the
-- window alone, first come first served.
--
-- Returns first: a returned slot's member is removed (ZREM), which a retry repeats harmlessly.
-- Then the grant: entries at or before now - window leave, and granted = min(want, limit - count)
-- slots, none when that is below least, are added as id..'#1' … id..'#granted', each scored at now + lease, the latest instant the
-- sidecar may use it (docs/design.md, "Leased admissions"). A retried call that finds id..'#1'
-- answers what the earlier attempt granted and adds nothing. The key lives at least lease + window
-- from now, so that every slot stays until it leaves the window; its lifetime only grows.
local key = KEYS[1]
local id, want, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local window, lease = tonumber(ARGV[4]), tonumber(ARGV[5])
local now
if ARGV[6] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[6])
end
local nows = string.format('%d', now)

local returned = 0
local back, from, to = ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9])
local least = math.max(tonumber(ARGV[10]) or 1, 1)
if back ~= '' then
  local ms = {}
  for j = from, to do
    ms[#ms + 1] = back .. '#' .. j
    if #ms == 1000 then
      returned = returned + redis.call('ZREM', key, unpack(ms))
      ms = {}
    end
  end
  if #ms > 0 then
    returned = returned + redis.call('ZREM', key, unpack(ms))
  end
end
if want == 0 then
  return { nows, 0, redis.call('ZCARD', key), 0, returned }
end

redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - window))
local card = redis.call('ZCARD', key)
local granted = 0
if redis.call('ZSCORE', key, id .. '#1') then
  granted = 1
  while granted < want and redis.call('ZSCORE', key, id .. '#' .. (granted + 1)) do
    granted = granted + 1
  end
else
  granted = math.max(math.min(want, limit - card), 0)
  if granted < least then
    granted = 0
  end
  local ends = string.format('%d', now + lease)
  local args = { 'NX' }
  for j = 1, granted do
    args[#args + 1] = ends
    args[#args + 1] = id .. '#' .. j
    if #args >= 1001 then
      card = card + redis.call('ZADD', key, unpack(args))
      args = { 'NX' }
    end
  end
  if #args > 1 then
    card = card + redis.call('ZADD', key, unpack(args))
  end
end
local wait = 0
if granted == 0 then
  local i = card - limit + least - 1 -- the entry whose leaving makes room for least
  local q = KEYS[2]
  if q then
    -- The entries scored up to the queue's horizon make room for callers
    -- refused before: this one waits for least more beyond them.
    local h = redis.call('GET', q)
    local ahead = h and redis.call('ZCOUNT', key, '-inf', h) or 0
    if ahead > 0 then
      i = math.max(i, ahead - 1 + least)
    end
    i = math.min(i, card - 1)
  end
  if i >= 0 and i < card then
    local at = redis.call('ZRANGE', key, i, i, 'WITHSCORES')
    wait = math.max(tonumber(at[2]) + window - now, 1)
    if q then
      redis.call('SET', q, at[2], 'PX', math.ceil((wait + lease) / 1000))
    end
  else
    wait = window
  end
end
if card > 0 then
  local life = math.ceil((lease + window) / 1000)
  if redis.call('PTTL', key) < life then
    redis.call('PEXPIRE', key, life)
  end
end
return { nows, granted, card, wait, returned }
