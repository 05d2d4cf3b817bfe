-- lru.lua: the clock, accounting and eviction shared by the scripts that
-- change or read an owner. It defines local constants and five functions,
-- pack_score, partition_key, refresh_tick, lru and prune; a script that uses them names lru in its
-- header's uses line, and is sent with this file before it (lua.go). Each
-- function a script defines costs time on every run, whether it is called or
-- not, so the others are made by lru(), which a script calls only on the
-- paths that need them: the paths that run most, a reserve or a record of a
-- live owner, call none but pack_score.
--
-- Each partition has a sorted set (the LRU) whose members are its owners'
-- keys (the state key without the partition's prefix) and whose scores pack
-- three numbers:
--
--   score = (touched_ms - 1735689600000) * 8192 + published * 4096 + size
--
-- touched_ms is when the state's entry and TTL were last refreshed
-- (reserve.lua says when), published is 1 when the
-- state holds a continuation (c: the current turn's or, once a reserve
-- consumed it, the one before), size is the state's stored-bytes estimate
-- (clamped below 4096): the estimate the store sends for the state without
-- its continuation, plus the length of c. Scores stay below 2^53 until
-- 2059. Ordering by score is ordering by last touch, which is when the
-- state's key was last given its TTL: a state whose touch is older than the
-- TTL is gone, whether or not Redis has removed its key yet, and the score
-- still tells the bytes and the continuation to give back. As the
-- state's fields tell its entry's size and published bit, reserve and
-- record read the entry only when they need its touch.
--
-- The owner scripts, whose KEYS[1] is the state, read the member from it:
-- the prefix "<ns>:{<ns>:<pp>}:o:" is one byte shorter than the LRU's name
-- "<ns>:{<ns>:<pp>}:lru", so the member is string.sub(KEYS[1], #lru),
-- where lru is the LRU's name: KEYS[2] of abort, clear and inspect;
-- partition_key(KEYS[1], 'lru') in reserve and record, which are not sent
-- the partition's keys.
--
-- The partition's hash holds:
--   bytes      sum of the sizes of the LRU's entries
--   published  number of the LRU's entries with published = 1
--   ev:ttl, ev:owners, ev:bytes  evictions by cause, since the namespace began

-- the scripts' epoch in ms, as oplog.lua's EPOCH_MS (a shared file stands
-- alone: it reads no other's names)
local SCORE_EPOCH_MS = 1735689600000
local TIME_UNIT = 8192
local PUBLISHED = 4096

-- pack_score returns the score of an entry touched at ms.
local function pack_score(ms, published, size)
  if size > PUBLISHED - 1 then size = PUBLISHED - 1 end
  return (ms - SCORE_EPOCH_MS) * TIME_UNIT + published * PUBLISHED + size
end

-- partition_key returns the name of the partition's key kind ('lru',
-- 'part') for the owner whose state key is state: the state's partition
-- prefix "<ns>:{<ns>:<pp>}:" followed by kind. A namespace holds no '}',
-- so the prefix ends at the first "}:o:".
local function partition_key(state, kind)
  return string.sub(state, 1, string.find(state, '}:o:', 1, true) + 1) .. kind
end

-- refresh_tick returns the tick of ms (milliseconds since the Unix epoch)
-- for a TTL of ttl milliseconds, which the state's o keeps for its last
-- refresh (reserve.lua): the time since 2025-01-01 in 256ths of the TTL (at
-- least a millisecond), modulo 256.
local function refresh_tick(ms, ttl)
  local unit = ttl - ttl % 256
  unit = unit > 0 and unit / 256 or 1
  local t = ms - SCORE_EPOCH_MS
  return (t - t % unit) / unit % 256
end

-- lru returns the functions that read the clock and a score and change an
-- LRU entry and the accounting, as a table: clock, idle, unpack_score,
-- touch, settle, remove.
local function lru()
  -- clock returns the server's clock (TIME) in milliseconds since the
  -- Unix epoch.
  local function clock()
    local t = redis.call('TIME')
    return t[1] * 1000 + (t[2] - t[2] % 1000) / 1000
  end

  -- idle returns the score below which an entry is idle: touched longer
  -- than ttl milliseconds before the clock.
  local function idle(ttl)
    return pack_score(clock() - ttl, 0, 0)
  end

  -- unpack_score returns a score's size and published (0 or 1).
  local function unpack_score(score)
    local low = score % TIME_UNIT
    if low >= PUBLISHED then return low - PUBLISHED, 1 end
    return low, 0
  end

  -- settle adds a change of stored bytes and of published states to the
  -- partition's counters and returns its stored bytes when it read them.
  local function settle(part, bytes, published)
    local total
    if bytes ~= 0 then total = redis.call('HINCRBY', part, 'bytes', bytes) end
    if published ~= 0 then redis.call('HINCRBY', part, 'published', published) end
    return total
  end

  -- touch files member in the LRU at score (a number, and score_s the same
  -- in decimal) in place of its entry old (a score, or nil for none; only
  -- its size and published bit count). It returns the change of the
  -- partition's stored bytes and published count, and the LRU's size when
  -- the entry is new.
  local function touch(lru_key, member, old, score, score_s)
    local added = redis.call('ZADD', lru_key, score_s, member) == 1
    local bytes, published = unpack_score(score)
    if added or not old then
      -- new, or lost while its state lived
      return bytes, published, redis.call('ZCARD', lru_key)
    end
    local b, p = unpack_score(old)
    return bytes - b, published - p, nil
  end

  -- remove deletes an owner's state KEYS[1] and takes its LRU entry old (a
  -- score, or nil for none) out of the LRU KEYS[2] and the accounting
  -- KEYS[3], for a script with the owner scripts' KEYS.
  local function remove(old)
    redis.call('DEL', KEYS[1])
    if old then
      redis.call('ZREM', KEYS[2], string.sub(KEYS[1], #KEYS[2]))
      local size, published = unpack_score(old)
      settle(KEYS[3], -size, -published)
    end
  end

  return {clock = clock, idle = idle, unpack_score = unpack_score, touch = touch, settle = settle,
    remove = remove}
end

-- prune evicts, at most budget entries: the least recently touched while it
-- is idle (touched before idle_score) or the partition holds more than
-- max_owners entries or more than max_bytes bytes; limits is the argument
-- that names those three, "<max_owners>:<max_bytes>:<budget>", which the
-- scripts that prune take as they are given. It never evicts keep (an
-- LRU member; false for none). count is the LRU's size when the call grew
-- it (nil: the owner limit is not checked), bytes the partition's stored
-- bytes when the call grew them (nil: the byte limit is not checked). State
-- keys are prefix followed by the member: keys not in KEYS, which a caller
-- names in a DELETES header line. prefix must be that of the partition of
-- lru_key and part, so that every key deleted has their hash tag and is in
-- their Redis Cluster slot. release(key, member) runs before each state is
-- deleted (oplog.lua: it keeps the answers the state holds). It returns the
-- number of evictions and their counts by cause.
local function prune(lru_key, part, prefix, keep, idle_score, limits, count, bytes, release)
  local max_owners, max_bytes, budget = string.match(limits, '^(%d+):(%d+):(%d+)$')
  max_owners, max_bytes, budget = max_owners + 0, max_bytes + 0, budget + 0
  local unpack_score = lru().unpack_score
  local ttl, owners, over, freed, unpublished = 0, 0, 0, 0, 0
  while ttl + owners + over < budget do
    local oldest = redis.call('ZRANGE', lru_key, 0, 1, 'WITHSCORES')
    local victim, score = oldest[1], oldest[2]
    if victim == keep then victim, score = oldest[3], oldest[4] end
    if not victim then break end
    score = tonumber(score)
    if score < idle_score then
      ttl = ttl + 1
    elseif count and count > max_owners then
      owners = owners + 1
    elseif bytes and bytes - freed > max_bytes then
      over = over + 1
    else
      break
    end
    release(prefix .. victim, victim)
    redis.call('DEL', prefix .. victim)
    redis.call('ZREM', lru_key, victim)
    local size, published = unpack_score(score)
    freed = freed + size
    unpublished = unpublished + published
    if count then count = count - 1 end
  end
  if freed > 0 then redis.call('HINCRBY', part, 'bytes', -freed) end
  if unpublished > 0 then redis.call('HINCRBY', part, 'published', -unpublished) end
  if ttl > 0 then redis.call('HINCRBY', part, 'ev:ttl', ttl) end
  if owners > 0 then redis.call('HINCRBY', part, 'ev:owners', owners) end
  if over > 0 then redis.call('HINCRBY', part, 'ev:bytes', over) end
  return ttl + owners + over, {ttl, owners, over}
end
