-- session_load.lua: read a session's head and journal in one step.
--
-- uses: none
-- flags: no-writes
--   (as a Redis function: it reads only, so it runs when the server is out of memory)
--
-- KEYS[1]  <ns>:{<ns>:<id>}:head  hash  version v; snapshot d, or journal header h and message count n
-- KEYS[2]  <ns>:{<ns>:<id>}:log   list  the journal's messages, oldest first
--
-- Reply: array
--   empty when there is no head, else
--   [1] version  [2] snapshot document or nil  [3] journal header or nil
--   [4] journal message count or nil  [5] array of the journal's messages

local head = redis.call('HMGET', KEYS[1], 'v', 'd', 'h', 'n')
if not head[1] then
  return {}
end
return {head[1], head[2], head[3], head[4], redis.call('LRANGE', KEYS[2], 0, -1)}
