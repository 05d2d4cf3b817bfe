-- reserve.lua: reserve a new turn for one owner, consuming its continuation.
--
-- Atomically: read the owner's state, draw the turn's sequence number from
-- the partition's clock, make the new turn the owner's current one (which
-- consumes the published continuation: nothing stays published), refresh
-- the owner's LRU entry and TTL when they are due, and evict (lru.lua)
-- while the partition is over its limits. The caller decides whether to
-- continue from the continuation returned.
--
-- An entry and its state's TTL are due for a refresh once they were touched
-- a sixteenth of the TTL ago or earlier; until then reserve leaves both as
-- they are (record never refreshes them).
--
-- The sequence number is the largest of
--   the partition's last sequence number + 1 (KEYS[5]),
--   the server clock in microseconds since 2025-01-01T00:00:00Z,
--   the owner's current sequence number + 1.
-- One reserve takes longer than a microsecond of server time, so the
-- sequence does not run ahead of the clock, and numbers drawn after Redis
-- lost the partition's data are still larger than those drawn before. The
-- store makes the turn token seq * partitions + partition (a 64-bit number).
--
-- The state's t is the current turn's sequence number, negated once that
-- turn published its continuation, c. Reserving sets t
-- (positive) and leaves c in place, so the LRU entry's size and published
-- bit stay as they were; s, the state's copy of its LRU score, changes with
-- the entry. The answer a re-sent reserve gives (oplog.lua) is
-- "<seq>:<existed><consumed>" followed by the consumed continuation.
--
-- uses: oplog, lru
--
-- KEYS[1]  <ns>:{<ns>:<pp>}:o:<owner>        hash    the owner's state: t, c, s
-- KEYS[2]  <ns>:{<ns>:<pp>}:lru              zset    the partition's LRU (lru.lua)
-- KEYS[3]  <ns>:{<ns>:<pp>}:part             hash    the partition's accounting
-- KEYS[4]  <ns>:{<ns>:<pp>}:q:<owner>:<op>   string  this operation's answer (oplog.lua)
-- KEYS[5]  <ns>:{<ns>:<pp>}:seq              string  the partition's last sequence number
-- DELETES  <ns>:{<ns>:<pp>}:o:<member>       hash    the state of each owner it evicts
--          (lru.lua prune), not in KEYS: named by KEYS[1]'s partition prefix
--          followed by the owner's LRU member. Safe in Redis Cluster: the name
--          has the hash tag {<ns>:<pp>} of the keys above, so it is in their
--          slot.
-- ARGV[1]  now, milliseconds since the Unix epoch; "0" for the server's clock
-- ARGV[2]  idle TTL of an owner's state, milliseconds
-- ARGV[3]  how long the answer stays, milliseconds
-- ARGV[4]  stored-bytes estimate of the state without its continuation
-- ARGV[5]  limits (lru.lua prune): "<partition's owner limit>:<partition's
--          stored-bytes limit>:<most evictions this call may make>"
--
-- Reply: array
--   [1] the new turn's sequence number (integer)
--   [2] 1 when the owner had live state before this call, else 0
--   [3] number of owners this call evicted
--   [4] the consumed continuation (opaque bytes), or nil when none

local st = redis.call('HMGET', KEYS[1], 't', 'c', 's')
-- The state's s is its LRU score; without a state, the LRU may still hold
-- an entry whose key expired. The owner's LRU member is read from the keys
-- (lru.lua).
local raw = st[3] or redis.call('ZSCORE', KEYS[2], string.sub(KEYS[1], #KEYS[2]))
local now = redis.call('TIME')
local sec, usec = now[1] + 0, now[2] + 0
-- The store's clock in milliseconds, as lru.lua's clock reads it: ARGV[1],
-- or this TIME when it is "0".
local ms = ARGV[1] == '0' and sec * 1000 + (usec - usec % 1000) / 1000 or ARGV[1] + 0
local ttl = ARGV[2] + 0
local old = raw and raw + 0
local idle = pack_score(ms - ttl, 0, 0)
local live = st[1] and not (old and old < idle)

-- The clock: one SET in the common case, a second when the clock is behind
-- the partition's or the owner's last number. A run that finds an earlier
-- run's answer puts back what it found (last).
local seq = (sec - 1735689600) * 1000000 + usec
local seq_s = string.format('%d', seq)
local last = redis.call('SET', KEYS[5], seq_s, 'GET')
local floor = (last or 0) + 1
local t = st[1] and st[1] + 0
if t and t >= floor then floor = t + 1 elseif t and -t >= floor then floor = 1 - t end
if floor > seq then
  seq = floor
  seq_s = string.format('%d', seq)
  redis.call('SET', KEYS[5], seq_s)
end

-- t < 0: the state holds the continuation its last turn published
local consumed = live and t < 0 and st[2]
local done = claim(KEYS[4], seq_s .. (live and ':1' or ':0') .. (consumed and '1' .. consumed or '0'), ARGV[3])
if done then
  if last then redis.call('SET', KEYS[5], last) else redis.call('DEL', KEYS[5]) end
  local colon = string.find(done, ':', 1, true)
  local c = nil
  if string.sub(done, colon + 2, colon + 2) == '1' then c = string.sub(done, colon + 3) end
  return {tonumber(string.sub(done, 1, colon - 1)), tonumber(string.sub(done, colon + 1, colon + 1)), 0, c}
end
if live and old and old >= pack_score(ms - (ttl - ttl % 16) / 16 + 1, 0, 0) then
  -- the entry and the TTL stay until they are due for a refresh
  redis.call('HSET', KEYS[1], 't', seq_s)
  return {seq, 1, 0, consumed or nil}
end

local size, published = ARGV[4] + 0, 0
if live and st[2] then
  size, published = size + #st[2], 1
elseif st[2] then
  redis.call('HDEL', KEYS[1], 'c')
end
local member = string.sub(KEYS[1], #KEYS[2])
local score = pack_score(ms, published, size)
local score_s = string.format('%d', score)
redis.call('HSET', KEYS[1], 't', seq_s, 's', score_s)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local change = lru()
local db, dp, count = change.touch(KEYS[2], member, old, score, score_s)
local bytes = change.settle(KEYS[3], db, dp)
local evicted = 0
if old and not live then
  -- idle: it had expired before anything pruned it, and others may have
  redis.call('HINCRBY', KEYS[3], 'ev:ttl', 1)
  evicted = 1
end
if count or db > 0 or evicted > 0 then
  if db <= 0 then bytes = nil end -- the byte limit is checked only when they grew
  evicted = evicted + prune(KEYS[2], KEYS[3], string.sub(KEYS[1], 1, #KEYS[2] - 1), member, idle, ARGV[5], count, bytes)
end

return {seq, live and 1 or 0, evicted, consumed or nil}
