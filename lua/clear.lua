-- clear.lua: remove an owner's state whatever its turn.
--
-- KEYS[1]  <ns>:{<ns>:<pp>}:o:<owner>  hash  the owner's state
-- KEYS[2]  <ns>:{<ns>:<pp>}:lru        zset  the partition's LRU (lru.lua)
-- KEYS[3]  <ns>:{<ns>:<pp>}:part       hash  the partition's sequence and accounting
--
-- Reply: integer
--   1  the owner had live state and it is removed
--   0  it had none

local a = open_partition(KEYS[3])
local n = redis.call('DEL', KEYS[1])
forget(a, KEYS[2], KEYS[1])
close_partition(a)
return n
