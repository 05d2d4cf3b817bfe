-- abort.lua: remove an owner's state if a turn is still its current one.
--
-- KEYS[1]  <ns>:{<ns>:<pp>}:o:<owner>  hash  the owner's state
-- KEYS[2]  <ns>:{<ns>:<pp>}:lru        zset  the partition's LRU (lru.lua)
-- KEYS[3]  <ns>:{<ns>:<pp>}:part       hash  the partition's sequence and accounting
-- ARGV[1]  the aborting turn token, decimal string
--
-- Reply: integer
--   1  the turn was current: the owner's state is removed
--   0  it was not (stale turn, or no state): nothing changed

if redis.call('HGET', KEYS[1], 't') ~= ARGV[1] then
  return 0
end
local a = open_partition(KEYS[3])
redis.call('DEL', KEYS[1])
forget(a, KEYS[2], KEYS[1])
close_partition(a)
return 1
