-- lru.lua: the accounting and eviction shared by the scripts that change an
-- owner. It is prepended to reserve.lua, record.lua, abort.lua, clear.lua and
-- prune.lua when they are loaded; it defines functions only.
--
-- Each partition has a sorted set (the LRU) whose members are the names of
-- its owners' state hashes and whose scores pack three numbers:
--
--   score = (touched_ms - 1735689600000) * 8192 + published * 4096 + size
--
-- touched_ms is the server time of the last touch, published is 1 when the
-- state holds a continuation, size is the state's stored-bytes estimate
-- (clamped below 4096). Scores stay below 2^53 until 2059. Ordering by score is
-- ordering by last touch. An entry whose touch is older than the TTL names a
-- key Redis has already expired: the score still tells the bytes and the
-- continuation to give back.
--
-- The partition's hash holds:
--   seq        the partition's turn sequence (reserve.lua)
--   bytes      sum of the sizes of the LRU's entries
--   published  number of the LRU's entries with published = 1
--   ev:ttl, ev:owners, ev:bytes  evictions by cause, since the namespace began

local SCORE_EPOCH_MS = 1735689600000
local TIME_UNIT = 8192
local PUBLISHED = 4096

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function fmt(n)
  return string.format('%.0f', n)
end

local function pack_score(ms, published, size)
  if size > PUBLISHED - 1 then size = PUBLISHED - 1 end
  return (ms - SCORE_EPOCH_MS) * TIME_UNIT + published * PUBLISHED + size
end

-- unpack_score returns published (0 or 1) and size.
local function unpack_score(score)
  local low = score % TIME_UNIT
  if low >= PUBLISHED then
    return 1, low - PUBLISHED
  end
  return 0, low
end

-- The partition's hash of one call: read once, changed in Lua, written
-- once. Evictions are rare, so their counters are incremented apart.
local function open_partition(part_key)
  local v = redis.call('HMGET', part_key, 'seq', 'bytes', 'published')
  return {key = part_key, seq = tonumber(v[1] or '0'), bytes = tonumber(v[2] or '0'),
    published = tonumber(v[3] or '0'), changed = false,
    evicted = {ttl = 0, owners = 0, bytes = 0}}
end

-- close_partition writes back what changed and returns the number of
-- evictions this call made.
local function close_partition(a)
  if a.changed then
    redis.call('HSET', a.key, 'seq', fmt(a.seq), 'bytes', fmt(a.bytes), 'published', fmt(a.published))
  end
  return a.evicted.ttl + a.evicted.owners + a.evicted.bytes
end

-- count_eviction counts one eviction by cause ('ttl', 'owners', 'bytes').
local function count_eviction(a, cause)
  redis.call('HINCRBY', a.key, 'ev:' .. cause, 1)
  a.evicted[cause] = a.evicted[cause] + 1
end

local function add_entry(a, score)
  local published, size = unpack_score(score)
  a.bytes = a.bytes + size
  a.published = a.published + published
  a.changed = true
end

local function drop_entry(a, score)
  local published, size = unpack_score(score)
  a.bytes = a.bytes - size
  a.published = a.published - published
  a.changed = true
end

-- forget removes key's LRU entry, if any, from the LRU and the accounting,
-- and returns its score (nil when there was none).
local function forget(a, lru_key, key)
  local score = redis.call('ZSCORE', lru_key, key)
  if not score then return nil end
  score = tonumber(score)
  redis.call('ZREM', lru_key, key)
  drop_entry(a, score)
  return score
end

-- touch records key in the LRU as touched now, replacing its entry if it
-- has one, and returns the previous entry's score (nil when none).
local function touch(a, lru_key, key, ms, published, size)
  local old = redis.call('ZSCORE', lru_key, key)
  if old then
    old = tonumber(old)
    drop_entry(a, old)
  end
  local score = pack_score(ms, published, size)
  redis.call('ZADD', lru_key, fmt(score), key)
  add_entry(a, score)
  return old
end

local function evict(a, lru_key, key, score)
  redis.call('DEL', key)
  redis.call('ZREM', lru_key, key)
  drop_entry(a, score)
end

-- prune evicts, at most budget entries in all: first those idle longer than
-- ttl_ms, then the least recently touched while the partition holds more
-- than max_owners entries or more than max_bytes bytes. It never evicts
-- keep (the owner being written; false for none).
local function prune(a, lru_key, keep, ms, ttl_ms, max_owners, max_bytes, budget)
  local done = 0
  local limit = pack_score(ms - ttl_ms, 0, 0)
  local idle = redis.call('ZRANGEBYSCORE', lru_key, '-inf', '(' .. fmt(limit),
    'WITHSCORES', 'LIMIT', 0, budget)
  for i = 1, #idle, 2 do
    if idle[i] ~= keep then
      evict(a, lru_key, idle[i], tonumber(idle[i + 1]))
      count_eviction(a, 'ttl')
      done = done + 1
    end
  end
  local count = redis.call('ZCARD', lru_key)
  while done < budget and (count > max_owners or a.bytes > max_bytes) do
    local oldest = redis.call('ZRANGE', lru_key, 0, 1, 'WITHSCORES')
    local victim, score = oldest[1], oldest[2]
    if victim == keep then victim, score = oldest[3], oldest[4] end
    if not victim then break end
    evict(a, lru_key, victim, tonumber(score))
    if count > max_owners then
      count_eviction(a, 'owners')
    else
      count_eviction(a, 'bytes')
    end
    count = count - 1
    done = done + 1
  end
end
