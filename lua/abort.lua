-- abort.lua: remove an owner's state if a turn is still its current one.
--
-- A re-sent abort that removed the state answers 1 again (oplog.lua).
--
-- uses: oplog, lru
--
-- KEYS[1]  <ns>:{<ns>:<pp>}:o:<owner>        hash    the owner's state (reserve.lua)
-- KEYS[2]  <ns>:{<ns>:<pp>}:lru              zset    the partition's LRU (lru.lua)
-- KEYS[3]  <ns>:{<ns>:<pp>}:part             hash    the partition's accounting
-- KEYS[4]  <ns>:{<ns>:<pp>}:q:<owner>:<op>   string  this operation's answer (oplog.lua)
-- ARGV[1]  now, milliseconds since the Unix epoch; "0" for the server's clock
-- ARGV[2]  idle TTL of an owner's state, milliseconds
-- ARGV[3]  how long the answer stays, milliseconds
-- ARGV[4]  the aborting turn's sequence number, decimal
--
-- Reply: integer
--   1  the turn was current: the owner's state is removed
--   0  it was not (stale turn, or no live state): nothing changed

local t = redis.call('HGET', KEYS[1], 't')
local current = t and math.abs(tonumber(t)) == tonumber(ARGV[4])
local change = current and lru()
local old = current and redis.call('ZSCORE', KEYS[2], string.sub(KEYS[1], #KEYS[2]))
if old then
  old = tonumber(old)
  current = old >= change.idle(ARGV[1], ARGV[2])
end
if not current then
  -- not current: nothing changes, unless an earlier run of this abort
  -- removed the state
  if answered(KEYS[4]) then return 1 end
  return 0
end
if not claim(KEYS[4], 'A', ARGV[3]) then
  change.remove(old)
end
return 1
