-- reserve.lua: reserve a new turn for one owner, consuming its continuation.
--
-- Atomically: read the owner's state, draw the turn's sequence number from
-- the partition's clock, make the new turn the owner's current one (which
-- consumes the published continuation: nothing stays published), refresh
-- the owner's LRU entry and TTL when they are due, and evict (lru.lua)
-- while the partition is over its limits. The caller decides whether to
-- continue from the continuation returned.
--
-- Refreshing is due once 15 ticks of a 256th of the TTL have passed since
-- the last refresh, which the state's o records (its tick, modulo 256: a
-- live state was refreshed less than 256 ticks ago), so the entry and TTL
-- were refreshed less than a sixteenth of the TTL before the owner's last
-- reserve. Record never refreshes them. Time is the server's (TIME): a
-- state is live while its key is.
--
-- The sequence number is the largest of
--   the partition's last sequence number + 1 (its clock key),
--   the server clock in microseconds since 2025-01-01T00:00:00Z,
--   the owner's current sequence number + 1.
-- One reserve takes longer than a microsecond of server time, so the
-- sequence does not run ahead of the clock, and numbers drawn after Redis
-- lost the partition's data are still larger than those drawn before. The
-- store makes the turn token seq * partitions + partition (a 64-bit number).
--
-- The state's t is the current turn's sequence number, negated once that
-- turn published its continuation, c. Reserving sets t (positive) and
-- leaves c in place, so the LRU entry's size and published bit stay as
-- they were. o holds this call's op and its answer's flags, '0' + 2 *
-- existed + consumed, the tick of the last refresh (one byte), then the op
-- of the last record that published (oplog.lua): a copy of this call
-- answers from it, or from its answer key once a later reserve moved it
-- there, "<seq>:<existed><consumed>" followed by the consumed
-- continuation.
--
-- uses: oplog, lru
--
-- KEYS[1]  <ns>:{<ns>:<pp>}:o:<owner>        hash    the owner's state: t, c, o
-- KEYS[2]  <ns>:{<ns>:<pp>}:q:<owner>:<op>   string  this call's answer key (oplog.lua)
-- WRITES   <ns>:{<ns>:<pp>}:seq              string  the partition's last sequence number
--          (its clock), not in KEYS (a key sent costs every call): named by
--          KEYS[1]'s partition prefix (lru.lua partition_key), so in its hash
--          tag and Redis Cluster slot.
-- CHANGES  <ns>:{<ns>:<pp>}:lru              zset    the partition's LRU (lru.lua) and
--          <ns>:{<ns>:<pp>}:part             hash    its accounting, when the owner's
--          entry changes, not in KEYS (most calls change no entry, and a key
--          sent costs every call): named by KEYS[1]'s partition prefix (lru.lua
--          partition_key), so in its hash tag and Redis Cluster slot.
-- DELETES  <ns>:{<ns>:<pp>}:o:<member>       hash    the state of each owner it evicts
--          (lru.lua prune), not in KEYS: named by KEYS[1]'s partition prefix
--          followed by the owner's LRU member. Safe in Redis Cluster: the name
--          has the hash tag {<ns>:<pp>} of the keys above, so it is in their
--          slot.
-- WRITES   <ns>:{<ns>:<pp>}:q:<member>:<op>  string  the answer key of a call
--          whose answer it moves out of a state (oplog.lua), not in KEYS: named
--          by KEYS[1]'s partition prefix, the owner's LRU member and the op.
--          Safe in Redis Cluster: the name has the hash tag {<ns>:<pp>} of the
--          keys above, so it is in their slot.
-- ARGV[1]  idle TTL of an owner's state, milliseconds
-- ARGV[2]  this call's op (oplog.lua): 9 bytes
-- ARGV[3]  stored-bytes estimate of the state without its continuation
-- ARGV[4]  limits (lru.lua prune): "<partition's owner limit>:<partition's
--          stored-bytes limit>:<most evictions this call may make>"
--
-- Reply: a string, "<seq>:<existed>:<evicted>", followed by ":" and the
-- consumed continuation when there is one (one string, not an array: a
-- table reply costs Redis far more to convert)
--   seq       the new turn's sequence number, decimal
--   existed   1 when the owner had live state before this call, else 0
--   evicted   number of owners this call evicted, decimal
--   the consumed continuation: opaque bytes
-- or, when no run of this call reserved and its deadline has passed,
-- {"expired", the server clock in milliseconds since 2025-01-01}: nothing
-- changed.

local st = redis.call('HMGET', KEYS[1], 't', 'c', 'o')
local now = redis.call('TIME')
local sec, usec = now[1] + 0, now[2] + 0
-- the server clock in ms since 2025-01-01
local server = (sec - EPOCH_S) * 1000 + (usec - usec % 1000) / 1000
local op = ARGV[2]
local t, c, o = st[1], st[2], st[3]
if o and string.sub(o, 1, 9) == op then
  -- this call's first run made the current turn; once the turn published
  -- (its client had the reply) the state no longer holds the continuation
  -- it consumed
  local flags = string.byte(o, 10) - 48
  local published = string.sub(t, 1, 1) == '-'
  local reply = (published and string.sub(t, 2) or t) .. (flags >= 2 and ':1:0' or ':0:0')
  if flags % 2 == 1 and not published and c then return reply .. ':' .. c end
  return reply
end
local done = redis.call('GET', KEYS[2])
if done then
  -- its first run's answer, moved out of the state by a later call
  local colon = string.find(done, ':', 1, true)
  local reply = string.sub(done, 1, colon + 1) .. ':0'
  if string.sub(done, colon + 2, colon + 2) == '1' then return reply .. ':' .. string.sub(done, colon + 3) end
  return reply
end
if deadline(op, 6, server) <= server then
  return {'expired', server} -- no run of this call reserved: none will
end

-- A state is live while its key is: its TTL and its entry's touch are
-- refreshed together. The entry of a state whose key expired stays until
-- something prunes it.
local ms = server + SCORE_EPOCH_MS
local ttl = ARGV[1] + 0
local tn = t and t + 0
local live = t and true or false
local old, lru_key
if not live then
  lru_key = partition_key(KEYS[1], 'lru')
  old = redis.call('ZSCORE', lru_key, string.sub(KEYS[1], #lru_key))
  old = old and old + 0
end

-- The clock: one SET in the common case, a second when the clock is behind
-- the partition's or the owner's last number.
local seq = (sec - EPOCH_S) * 1000000 + usec
local seq_s = string.format('%d', seq)
local seq_key = partition_key(KEYS[1], 'seq')
local last = redis.call('SET', seq_key, seq_s, 'GET')
local floor = (last or 0) + 1
if tn and tn >= floor then floor = tn + 1 elseif tn and -tn >= floor then floor = 1 - tn end
if floor > seq then
  seq = floor
  seq_s = string.format('%d', seq)
  redis.call('SET', seq_key, seq_s)
end

-- t < 0: the state holds the continuation its last turn published
local consumed = live and tn < 0 and c
local slot = op .. (consumed and '3' or live and '2' or '0')
if o then
  -- the answers of the calls this one replaces go to their answer keys
  -- while those calls may be re-sent
  local prefix = string.sub(KEYS[2], 1, #KEYS[2] - 18)
  if deadline(o, 6, server) > server then spills().reserve(o, t, c, server, prefix) end
  if not live and #o >= 20 and deadline(o, 17, server) > server then spills().record(o, server, prefix) end
end
local now_tick = refresh_tick(ms, ttl)
if live then
  if o and (now_tick - string.byte(o, 11)) % 256 < 15 then
    -- the entry and the TTL stay until they are due for a refresh
    redis.call('HSET', KEYS[1], 't', seq_s, 'o', slot .. string.sub(o, 11))
    return seq_s .. (consumed and ':1:0:' .. consumed or ':1:0')
  end
end
slot = slot .. string.char(now_tick) .. (live and o and string.sub(o, 12) or '')

local size, published = ARGV[3] + 0, 0
if live and c then
  size, published = size + #c, 1
elseif c then
  redis.call('HDEL', KEYS[1], 'c')
end
local score = pack_score(ms, published, size)
local score_s = string.format('%d', score)
redis.call('HSET', KEYS[1], 't', seq_s, 'o', slot)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
lru_key = lru_key or partition_key(KEYS[1], 'lru')
local part_key = partition_key(KEYS[1], 'part')
local member = string.sub(KEYS[1], #lru_key)
local change = lru()
-- A live state's entry has its size and published bit (lru.lua).
local db, dp, count = change.touch(lru_key, member, live and (old or pack_score(SCORE_EPOCH_MS, published, size)) or old,
  score, score_s)
local bytes = change.settle(part_key, db, dp)
local evicted = 0
if old and not live then
  -- idle: it had expired before anything pruned it, and others may have
  redis.call('HINCRBY', part_key, 'ev:ttl', 1)
  evicted = 1
end
if count or db > 0 or evicted > 0 then
  if db <= 0 then bytes = nil end -- the byte limit is checked only when they grew
  evicted = evicted + prune(lru_key, part_key, string.sub(KEYS[1], 1, #lru_key - 1), member,
    pack_score(ms - ttl, 0, 0), ARGV[4], count, bytes, spills().releaser(server))
end

return seq_s .. (live and ':1:' or ':0:') .. evicted .. (consumed and ':' .. consumed or '')
