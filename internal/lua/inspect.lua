-- inspect.lua: read an owner's state and its LRU entry without changing
-- anything.
--
-- uses: none
-- flags: no-writes
--   (as a Redis function: it reads only, so it runs when the server is out of memory)
--
-- KEYS[1]  <ns>:{<ns>:<pp>}:o:<owner>  hash  the owner's state (reserve.lua)
-- KEYS[2]  <ns>:{<ns>:<pp>}:lru        zset  the partition's LRU (lru.lua)
--
-- Reply: array
--   empty when the owner has no live state, else
--   [1] the owner's LRU score (string, lru.lua), or nil when it has none
--   [2] the current turn t (reserve.lua: negative once it published)
--   [3] the last published continuation c, or nil

local st = redis.call('HMGET', KEYS[1], 't', 'c')
if not st[1] then
  return {}
end
return {redis.call('ZSCORE', KEYS[2], string.sub(KEYS[1], #KEYS[2])), st[1], st[2]}
