-- record.lua: publish a turn's response as the owner's continuation.
--
-- Publishes only when the owner's state is live and its current turn is
-- the one recording (published already or not: a second record of the turn
-- replaces its continuation); otherwise changes nothing. Publishing keeps
-- the owner's LRU touch and TTL (reserve refreshes them), changes the LRU
-- entry's size and published bit when they change, and evicts (lru.lua)
-- while the partition is over its limits.
--
-- Publishing writes this call's op as the record's part of the state's o
-- (reserve.lua, oplog.lua), so a copy answers "published" again. A copy can
-- only find the turn in flight (t = ARGV[3]) if no earlier run of it
-- published, which is why the record that publishes it need not look for
-- an earlier answer, nor check its deadline: a late first run may still
-- publish. The answer of the record it replaces goes to that call's answer
-- key while the call may be re-sent: when its deadline is after the turn
-- began, this call reads the server's clock to tell.
--
-- uses: oplog, lru
--
-- KEYS[1]  <ns>:{<ns>:<pp>}:o:<owner>        hash    the owner's state (reserve.lua)
-- KEYS[2]  <ns>:{<ns>:<pp>}:q:<owner>:<op>   string  this call's answer key (oplog.lua)
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
-- ARGV[3]  the recording turn's sequence number, decimal
-- ARGV[4]  the continuation (opaque bytes)
-- ARGV[5]  stored-bytes estimate of the state without its continuation
-- ARGV[6]  limits (lru.lua prune): "<partition's owner limit>:<partition's
--          stored-bytes limit>:<most evictions this call may make>"
--
-- Reply: a string, "<status>:<evicted>" (one string, not an array: a table
-- reply costs Redis far more to convert)
--   status   "published"  the continuation is stored
--            "stale"      the owner's current turn is another turn: nothing changed
--            "gone"       the owner has no live state (expired, evicted, cleared)
--   evicted  number of owners this call evicted, decimal
-- or, when the op's deadline has passed, {"expired", the server clock in
-- milliseconds since 2025-01-01}: nothing changed.

local st = redis.call('HMGET', KEYS[1], 't', 'c', 'o')
local t, c, o = st[1], st[2], st[3]
local op = ARGV[2]
if o and string.sub(o, 12, 20) == op then
  return 'published:0' -- this call's first run published
end
-- server is the server clock in ms since 2025-01-01, read when needed. A
-- call that changes nothing answers "published" when an earlier run of it
-- published, as its answer key tells. A state is live while its key is
-- (reserve.lua).
local server
if not t then return redis.call('GET', KEYS[2]) and 'published:0' or 'gone:0' end
if t ~= ARGV[3] then
  if t ~= '-' .. ARGV[3] then return redis.call('GET', KEYS[2]) and 'published:0' or 'stale:0' end
  -- published already: by this call's first run, by another call with the
  -- same continuation (nothing to do) or by another record of the turn,
  -- which this one replaces unless it ran already
  if c == ARGV[4] or redis.call('GET', KEYS[2]) then return 'published:0' end
  server = oplog().now()
  if deadline(op, 6, server) <= server then return {'expired', server} end
end

local seq = ARGV[3]
local turn_ms = (seq - seq % 1000) / 1000 -- when the turn began, ms since 2025-01-01
local slot = (o and string.sub(o, 1, 11) or string.rep('0', 11)) .. op
if o and #o >= 20 and deadline(o, 17, turn_ms) > turn_ms then
  server = server or oplog().now()
  spills().record(o, server, string.sub(KEYS[2], 1, #KEYS[2] - 18))
end
if c and #c == #ARGV[4] then
  -- the entry's size and published bit stay (lru.lua)
  redis.call('HSET', KEYS[1], 't', '-' .. seq, 'c', ARGV[4], 'o', slot)
  return 'published:0'
end

local lru_key = partition_key(KEYS[1], 'lru')
local old = redis.call('ZSCORE', lru_key, string.sub(KEYS[1], #lru_key))
old = old and old + 0
local change, score
if old then
  -- the touch stays; the size and the published bit may change
  score = old - old % TIME_UNIT + pack_score(SCORE_EPOCH_MS, 1, ARGV[5] + #ARGV[4])
  if score == old then
    redis.call('HSET', KEYS[1], 't', '-' .. seq, 'c', ARGV[4], 'o', slot)
    return 'published:0'
  end
else
  -- a state whose entry is lost is touched now, and o's refresh tick
  -- (reserve.lua) with it
  change = lru()
  local ms = change.clock()
  slot = string.sub(slot, 1, 10) .. string.char(refresh_tick(ms, ARGV[1] + 0)) .. op
  score = pack_score(ms, 1, ARGV[5] + #ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
local score_s = string.format('%d', score)
redis.call('HSET', KEYS[1], 't', '-' .. seq, 'c', ARGV[4], 'o', slot)
change = change or lru()
local member = string.sub(KEYS[1], #lru_key)
local part_key = partition_key(KEYS[1], 'part')
local db, dp, count = change.touch(lru_key, member, old, score, score_s)
local bytes = change.settle(part_key, db, dp)
local evicted = 0
if count or db > 0 then
  evicted = prune(lru_key, part_key, string.sub(KEYS[1], 1, #lru_key - 1), member,
    change.idle(ARGV[1]), ARGV[6], count, bytes, spills().releaser(server or oplog().now()))
end
return 'published:' .. evicted
