-- inspect.lua: read an owner's state and its LRU entry without changing
-- anything.
--
-- KEYS[1]  <ns>:{<ns>:<pp>}:o:<owner>  hash  the owner's state
-- KEYS[2]  <ns>:{<ns>:<pp>}:lru        zset  the partition's LRU (lru.lua)
--
-- Reply: array
--   empty when the owner has no live state, else
--   [1] the owner's LRU score (string, lru.lua), or nil when it has none
--   [2] the state hash as HGETALL returns it: field, value, field, value…

local fields = redis.call('HGETALL', KEYS[1])
if #fields == 0 then
  return {}
end
return {redis.call('ZSCORE', KEYS[2], KEYS[1]), fields}
