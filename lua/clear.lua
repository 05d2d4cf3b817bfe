-- clear.lua: remove an owner's state whatever its turn.
--
-- A re-sent clear that removed the state answers 1 again and leaves a turn
-- reserved after its first run alone (oplog.lua).
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
--
-- Reply: integer
--   1  the owner had live state and it is removed
--   0  it had none: with neither state nor LRU entry nothing changes (the
--      accounting is not touched); an idle state is removed all the same,
--      with no answer stored (a copy that runs again answers 0 as well)

local old = redis.call('ZSCORE', KEYS[2], string.sub(KEYS[1], #KEYS[2]))
local exists = redis.call('EXISTS', KEYS[1]) == 1
if old then old = tonumber(old) end
local change = lru()
local live = exists and not (old and old < change.idle(ARGV[1], ARGV[2]))
if not live then
  -- An earlier run of this clear removed the state: nothing changes.
  if answered(KEYS[4]) then return 1 end
  if not old and not exists then
    -- No state and no LRU entry: nothing to delete, and the accounting
    -- KEYS[3] is left untouched.
    return 0
  end
  change.remove(old)
  return 0
end
if not claim(KEYS[4], 'C', ARGV[3]) then
  change.remove(old)
end
return 1
