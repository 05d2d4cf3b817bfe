-- clear.lua: remove an owner's state whatever its turn.
--
-- A run that removes a live state keeps the answers the state holds and
-- its own, "C", in its answer key until its deadline (oplog.lua); a copy
-- that finds it answers 1 again and leaves a turn reserved after the first
-- run alone. No run changes anything after the call's deadline.
--
-- uses: oplog, lru
--
-- KEYS[1]  <ns>:{<ns>:<pp>}:o:<owner>        hash    the owner's state (reserve.lua)
-- KEYS[2]  <ns>:{<ns>:<pp>}:lru              zset    the partition's LRU (lru.lua)
-- KEYS[3]  <ns>:{<ns>:<pp>}:part             hash    the partition's accounting
-- KEYS[4]  <ns>:{<ns>:<pp>}:q:<owner>:<op>   string  this call's answer key (oplog.lua)
-- WRITES   <ns>:{<ns>:<pp>}:q:<member>:<op>  string  the answer key of a call
--          whose answer it moves out of the state (oplog.lua), not in KEYS:
--          named by KEYS[1]'s partition prefix, the owner's LRU member and the
--          op. Safe in Redis Cluster: the name has the hash tag {<ns>:<pp>} of
--          the keys above, so it is in their slot.
-- ARGV[1]  now, milliseconds since the Unix epoch; "0" for the server's clock
-- ARGV[2]  idle TTL of an owner's state, milliseconds
-- ARGV[3]  this call's op (oplog.lua): 9 bytes
--
-- Reply: integer
--   1  the owner had live state and it is removed
--   0  it had none: with neither state nor LRU entry nothing changes (the
--      accounting is not touched); an idle state is removed all the same,
--      with no answer stored (a copy that runs again answers 0 as well)
-- or, when the op's deadline has passed and nothing changed, the array
-- {"expired", the server clock in milliseconds since 2025-01-01}.

local log = oplog()
local server = log.now()
local due = deadline(ARGV[3], 6, server)
if due <= server then return {'expired', server} end
local old = redis.call('ZSCORE', KEYS[2], string.sub(KEYS[1], #KEYS[2]))
local st = redis.call('HMGET', KEYS[1], 't', 'c', 'o')
if old then old = tonumber(old) end
local change = lru()
local live = st[1] and not (old and old < change.idle(ARGV[1], ARGV[2]))
if not live then
  -- An earlier run of this clear removed the state: nothing changes.
  if redis.call('GET', KEYS[4]) then return 1 end
  if not old and not st[1] then
    -- No state and no LRU entry: nothing to delete, and the accounting
    -- KEYS[3] is left untouched.
    return 0
  end
  change.remove(old)
  return 0
end
if log.claim(4, 'C', due) then return 1 end
if st[3] then spills().all(string.sub(KEYS[4], 1, #KEYS[4] - 18), st[3], st[1], st[2], server) end
change.remove(old)
return 1
