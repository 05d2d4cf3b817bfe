-- reserve.lua: reserve a new turn for one owner, consuming its continuation.
--
-- Atomically: read the owner's published continuation (if any), draw a turn
-- token from the partition's hybrid clock, replace the owner's state with a
-- fresh one that holds only the new turn, touch it in the LRU, and evict
-- (lru.lua) while the partition is over its limits. The caller decides
-- whether to continue from the continuation returned; nothing stays
-- published.
--
-- Turn token = seq * partitions + partition, where seq is the largest of
--   the partition's sequence + 1,
--   the server clock in ticks of 1/8 ms since 2025-01-01T00:00:00Z,
--   the owner's current turn's seq + 1,
-- so tokens keep increasing per owner even when the sequence is lost.
-- Every number stays below 2^53.
--
-- A client may send the same call twice (go-redis retries a command whose
-- reply timed out). The fresh state keeps the call's nonce and its answer
-- until the turn records, so a second run with the same nonce returns the
-- first run's answer instead of consuming the owner's state again.
--
-- KEYS[1]  <ns>:{<ns>:<pp>}:o:<owner>  hash  the owner's state
-- KEYS[2]  <ns>:{<ns>:<pp>}:lru        zset  the partition's LRU (lru.lua)
-- KEYS[3]  <ns>:{<ns>:<pp>}:part       hash  the partition's sequence and accounting
-- ARGV[1]  idle TTL of an owner's state, milliseconds
-- ARGV[2]  partition count of the namespace
-- ARGV[3]  this owner's partition, 0-based
-- ARGV[4]  stored-bytes estimate of the fresh state (below 4096)
-- ARGV[5]  the partition's owner limit
-- ARGV[6]  the partition's stored-bytes limit
-- ARGV[7]  most evictions this call may make
-- ARGV[8]  the call's nonce (hex string)
--
-- Reply: array
--   [1] the new turn token, decimal string
--   [2] 1 when the owner had live state before this call, else 0
--   [3] number of owners this call evicted
--   [4] response id of the consumed continuation, or nil when none
--   [5] origin replica id          [6] origin socket id (decimal string)
--   [7] transcript item count      [8] transcript digest (decimal int64)
--   [9] prompt signature (decimal int64)
--   [10] transcript canonical bytes
-- Errors: "ERR turn overflow" when the token would reach 2^53.

local EPOCH_S = 1735689600
local TICKS_PER_MS = 8

local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ticks = (tonumber(t[1]) - EPOCH_S) * 1000 * TICKS_PER_MS
  + math.floor(tonumber(t[2]) * TICKS_PER_MS / 1000)

local old = redis.call('HMGET', KEYS[1], 't', 'r', 's', 'i', 'n', 'd', 'g', 'b',
  'q', 'x', 'pr', 'ps', 'pi', 'pn', 'pd', 'pg', 'pb')
if old[9] == ARGV[8] then
  -- A repeated call: answer as the first run did.
  return {old[1], tonumber(old[10]), 0, old[11], old[12], old[13], old[14], old[15], old[16], old[17]}
end
local parts = tonumber(ARGV[2])
local a = open_partition(KEYS[3])

local seq = a.seq + 1
if ticks > seq then seq = ticks end
if old[1] then
  local owner_next = math.floor(tonumber(old[1]) / parts) + 1
  if owner_next > seq then seq = owner_next end
end
local turn = seq * parts + tonumber(ARGV[3])
if turn >= 9007199254740992 then
  return redis.error_reply('ERR turn overflow')
end
local turn_s = fmt(turn)
a.seq = seq
a.changed = true

local existed = 0
if old[1] then existed = 1 end
redis.call('DEL', KEYS[1])
if old[2] then
  redis.call('HSET', KEYS[1], 't', turn_s, 'q', ARGV[8], 'x', existed,
    'pr', old[2], 'ps', old[3], 'pi', old[4], 'pn', old[5], 'pd', old[6], 'pg', old[7], 'pb', old[8])
else
  redis.call('HSET', KEYS[1], 't', turn_s, 'q', ARGV[8], 'x', existed)
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
if touch(a, KEYS[2], KEYS[1], ms, 0, tonumber(ARGV[4])) and not old[1] then
  count_eviction(a, 'ttl') -- it had expired before anything pruned it
end
prune(a, KEYS[2], KEYS[1], ms, tonumber(ARGV[1]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]))
local evicted = close_partition(a)

return {turn_s, existed, evicted, old[2], old[3], old[4], old[5], old[6], old[7], old[8]}
