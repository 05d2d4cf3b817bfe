-- record.lua: publish a turn's response as the owner's continuation.
--
-- Publishes only when the owner's state is live and its current turn is
-- the one recording (published already or not: a second record of the turn
-- replaces its continuation); otherwise changes nothing. Publishing keeps
-- the owner's LRU touch and TTL (reserve refreshes them), changes the LRU
-- entry's size and published bit when they change, and evicts (lru.lua)
-- while the partition is over its limits. A re-sent record that published
-- answers "published" again (oplog.lua).
--
-- uses: oplog, lru
--
-- KEYS[1]  <ns>:{<ns>:<pp>}:o:<owner>        hash    the owner's state (reserve.lua)
-- KEYS[2]  <ns>:{<ns>:<pp>}:lru              zset    the partition's LRU (lru.lua)
-- KEYS[3]  <ns>:{<ns>:<pp>}:part             hash    the partition's accounting
-- KEYS[4]  <ns>:{<ns>:<pp>}:q:<owner>:<op>   string  this operation's answer (oplog.lua)
-- DELETES  <ns>:{<ns>:<pp>}:o:<member>       hash    the state of each owner it evicts
--          (lru.lua prune), not in KEYS: named by KEYS[1]'s partition prefix
--          followed by the owner's LRU member. Safe in Redis Cluster: the name
--          has the hash tag {<ns>:<pp>} of the keys above, so it is in their
--          slot.
-- ARGV[1]  now, milliseconds since the Unix epoch; "0" for the server's clock
-- ARGV[2]  idle TTL of an owner's state, milliseconds
-- ARGV[3]  how long the answer stays, milliseconds
-- ARGV[4]  the recording turn's sequence number, decimal
-- ARGV[5]  the continuation (opaque bytes)
-- ARGV[6]  stored-bytes estimate of the state without its continuation
-- ARGV[7]  limits (lru.lua prune): "<partition's owner limit>:<partition's
--          stored-bytes limit>:<most evictions this call may make>"
--
-- Reply: array
--   [1] status string:
--       "published"  the continuation is stored
--       "stale"      the owner's current turn is another turn: nothing changed
--       "gone"       the owner has no live state (expired, evicted, cleared)
--   [2] number of owners this call evicted

-- A call that changes nothing answers "gone" or "stale", or "published"
-- when an earlier run of this record published (oplog.lua).
local st = redis.call('HMGET', KEYS[1], 't', 's')
local t = st[1]
if not t then
  return {answered(KEYS[4]) and 'published' or 'gone', 0}
end
local old = st[2] or redis.call('ZSCORE', KEYS[2], string.sub(KEYS[1], #KEYS[2]))
if old then old = old + 0 end
-- On the server's clock, Redis has expired the key of an idle state: its
-- TTL and its entry's touch are refreshed together (reserve.lua).
if old and ARGV[1] ~= '0' and old < pack_score(ARGV[1] - ARGV[2], 0, 0) then
  return {answered(KEYS[4]) and 'published' or 'gone', 0}
end
if t ~= ARGV[4] and t ~= '-' .. ARGV[4] then
  return {answered(KEYS[4]) and 'published' or 'stale', 0}
end
if claim(KEYS[4], 'P', ARGV[3]) then
  return {'published', 0}
end

local change, score
if old then
  -- the touch stays; the size and the published bit may change
  score = old - old % TIME_UNIT + pack_score(SCORE_EPOCH_MS, 1, ARGV[6] + #ARGV[5])
  if score == old then
    redis.call('HSET', KEYS[1], 't', '-' .. ARGV[4], 'c', ARGV[5])
    return {'published', 0}
  end
else
  -- a state whose entry has no score (neither s nor an LRU entry) is
  -- touched now
  change = lru()
  score = pack_score(change.clock(ARGV[1]), 1, ARGV[6] + #ARGV[5])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
local score_s = string.format('%d', score)
redis.call('HSET', KEYS[1], 't', '-' .. ARGV[4], 'c', ARGV[5], 's', score_s)
change = change or lru()
local member = string.sub(KEYS[1], #KEYS[2])
local db, dp, count = change.touch(KEYS[2], member, old, score, score_s)
local bytes = change.settle(KEYS[3], db, dp)
local evicted = 0
if count or db > 0 then
  evicted = prune(KEYS[2], KEYS[3], string.sub(KEYS[1], 1, #KEYS[2] - 1), member,
    change.idle(ARGV[1], ARGV[2]), ARGV[7], count, bytes)
end
return {'published', evicted}
