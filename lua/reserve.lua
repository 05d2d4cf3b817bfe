-- reserve.lua: reserve a new turn for one owner, consuming its continuation.
--
-- Atomically: read the owner's state, draw the turn's sequence number from
-- the partition's clock, make the new turn the owner's current one (which
-- consumes the published continuation: nothing stays published), touch the
-- owner in the LRU, and evict (lru.lua) while the partition is over its
-- limits. The caller decides whether to continue from the continuation
-- returned.
--
-- The sequence number is the largest of
--   the partition's last sequence number + 1,
--   the server clock in microseconds since 2025-01-01T00:00:00Z,
--   the owner's current sequence number + 1.
-- One reserve takes longer than a microsecond of server time, so the
-- sequence does not run ahead of the clock, and numbers drawn after Redis
-- lost the partition's data are still larger than those drawn before. The
-- store makes the turn token seq * partitions + partition (a 64-bit number).
--
-- The state's t is the current turn's sequence number, negated once that
-- turn published: the state then holds a continuation, c. Reserving sets t
-- only (positive) and leaves c in place. The answer a re-sent reserve gives
-- (oplog.lua) is "<seq>:<existed><consumed>" followed by the consumed
-- continuation.
--
-- uses: oplog, lru
--
-- KEYS[1]  <ns>:{<ns>:<pp>}:o:<owner>        hash    the owner's state: t, c
-- KEYS[2]  <ns>:{<ns>:<pp>}:lru              zset    the partition's LRU (lru.lua)
-- KEYS[3]  <ns>:{<ns>:<pp>}:part             hash    the partition's clock and accounting
-- KEYS[4]  <ns>:{<ns>:<pp>}:q:<owner>:<op>   string  this operation's answer (oplog.lua)
-- DELETES  <ns>:{<ns>:<pp>}:o:<member>       hash    the state of each owner it evicts
--          (lru.lua prune), not in KEYS: named by KEYS[1]'s partition prefix
--          followed by the owner's LRU member. Safe in Redis Cluster: the name
--          has the hash tag {<ns>:<pp>} of the keys above, so it is in their
--          slot.
-- ARGV[1]  now, milliseconds since the Unix epoch; "0" for the server's clock
-- ARGV[2]  idle TTL of an owner's state, milliseconds
-- ARGV[3]  the owner's LRU member: KEYS[1] without its partition's prefix
-- ARGV[4]  how long the answer stays, milliseconds
-- ARGV[5]  stored-bytes estimate of the state without its continuation
-- ARGV[6]  the partition's owner limit
-- ARGV[7]  the partition's stored-bytes limit
-- ARGV[8]  most evictions this call may make
--
-- Reply: array
--   [1] the new turn's sequence number (integer)
--   [2] 1 when the owner had live state before this call, else 0
--   [3] number of owners this call evicted
--   [4] the consumed continuation (opaque bytes), or nil when none

local st = redis.call('HMGET', KEYS[1], 't', 'c')

local t = redis.call('TIME')
local ms = tonumber(ARGV[1])
if ms == 0 then ms = t[1] * 1000 + math.floor(t[2] / 1000) end
local ttl = tonumber(ARGV[2])
local member = ARGV[3]
local old = redis.call('ZSCORE', KEYS[2], member)
if old then old = tonumber(old) end
local idle = pack_score(ms - ttl, 0, 0)
local t_old = st[1] and tonumber(st[1])
local live = t_old and not (old and old < idle)

local part = redis.call('HMGET', KEYS[3], 'seq', 'bytes', 'published')
local seq = tonumber(part[1] or '0') + 1
local us = (t[1] - 1735689600) * 1000000 + t[2]
if us > seq then seq = us end
if t_old and math.abs(t_old) + 1 > seq then seq = math.abs(t_old) + 1 end
local seq_s = string.format('%.0f', seq)

local existed, consumed, c = 0, 0, nil
local size = tonumber(ARGV[5])
if live then
  existed = 1
  if t_old < 0 then consumed, c = 1, st[2] end
  if st[2] then size = size + #st[2] end
end
local done = claim(KEYS[4], seq_s .. ':' .. existed .. consumed .. (c or ''), ARGV[4])
if done then
  local colon = string.find(done, ':', 1, true)
  c = nil
  if string.sub(done, colon + 2, colon + 2) == '1' then c = string.sub(done, colon + 3) end
  return {tonumber(string.sub(done, 1, colon - 1)), tonumber(string.sub(done, colon + 1, colon + 1)), 0, c}
end
if st[2] and not live then
  redis.call('HDEL', KEYS[1], 'c')
end
redis.call('HSET', KEYS[1], 't', seq_s)
redis.call('PEXPIRE', KEYS[1], ttl)

local db, dp, count = touch(KEYS[2], member, old, pack_score(ms, 0, size))
local bytes = tonumber(part[2] or '0') + db
redis.call('HSET', KEYS[3], 'seq', seq_s, 'bytes', bytes, 'published', tonumber(part[3] or '0') + dp)
local evicted = 0
if old and not live then
  -- idle: it had expired before anything pruned it, and others may have
  redis.call('HINCRBY', KEYS[3], 'ev:ttl', 1)
  evicted = 1
end
if count or db > 0 or evicted > 0 then
  if db <= 0 then bytes = nil end
  evicted = evicted + prune(KEYS[2], KEYS[3], string.sub(KEYS[1], 1, #KEYS[1] - #member), member, idle,
    tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), count, bytes)
end

return {seq, existed, evicted, c}
