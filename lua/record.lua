-- record.lua: publish a turn's response as the owner's continuation.
--
-- Publishes only when the owner's state still exists and its current turn is
-- the one recording; otherwise changes nothing. Publishing touches the owner
-- in the LRU and evicts (lru.lua) while the partition is over its limits.
--
-- KEYS[1]  <ns>:{<ns>:<pp>}:o:<owner>  hash  the owner's state
-- KEYS[2]  <ns>:{<ns>:<pp>}:lru        zset  the partition's LRU (lru.lua)
-- KEYS[3]  <ns>:{<ns>:<pp>}:part       hash  the partition's sequence and accounting
-- ARGV[1]  the recording turn token, decimal string
-- ARGV[2]  idle TTL of an owner's state, milliseconds
-- ARGV[3]  response id
-- ARGV[4]  origin replica id
-- ARGV[5]  origin socket id, decimal string
-- ARGV[6]  transcript item count (input + output)
-- ARGV[7]  transcript digest, decimal int64
-- ARGV[8]  prompt signature, decimal int64
-- ARGV[9]  transcript canonical bytes
-- ARGV[10] stored-bytes estimate of the published state (below 4096)
-- ARGV[11] the partition's owner limit
-- ARGV[12] the partition's stored-bytes limit
-- ARGV[13] most evictions this call may make
--
-- Reply: array
--   [1] status string:
--       "published"  the continuation is stored and the TTL refreshed
--       "stale"      the owner's current turn is another turn: nothing changed
--       "gone"       the owner has no state (expired, evicted, cleared)
--   [2] number of owners this call evicted

local cur = redis.call('HGET', KEYS[1], 't')
if not cur then
  return {'gone', 0}
end
if cur ~= ARGV[1] then
  return {'stale', 0}
end

local ms = now_ms()
local a = open_partition(KEYS[3])
redis.call('HSET', KEYS[1],
  'r', ARGV[3], 's', ARGV[4], 'i', ARGV[5],
  'n', ARGV[6], 'd', ARGV[7], 'g', ARGV[8], 'b', ARGV[9])
-- The reservation's retry answer (reserve.lua) is no longer needed.
redis.call('HDEL', KEYS[1], 'q', 'x', 'pr', 'ps', 'pi', 'pn', 'pd', 'pg', 'pb')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
touch(a, KEYS[2], KEYS[1], ms, 1, tonumber(ARGV[10]))
prune(a, KEYS[2], KEYS[1], ms, tonumber(ARGV[2]), tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13]))
return {'published', close_partition(a)}
