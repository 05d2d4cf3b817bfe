-- abort.lua: remove an owner's state if a turn is still its current one.
--
-- A run that finds the turn current is the call's first (a run that
-- removed the state leaves none with this turn): it keeps the answers the
-- state holds (oplog.lua) and its own, "A", in its answer key until its
-- deadline, so that a copy answers 1 again.
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
-- ARGV[1]  this call's op (oplog.lua): 9 bytes
-- ARGV[2]  the aborting turn's sequence number, decimal
--
-- Reply: integer
--   1  the turn was current: the owner's state is removed
--   0  it was not (stale turn, or no live state): nothing changed

local st = redis.call('HMGET', KEYS[1], 't', 'c', 'o')
local current = st[1] and math.abs(tonumber(st[1])) == tonumber(ARGV[2])
if not current then
  -- nothing changes, unless an earlier run of this abort removed the state
  if redis.call('GET', KEYS[4]) then return 1 end
  return 0
end
local log = oplog()
local server = log.now()
if st[3] then spills().all(st[3], st[1], st[2], server) end
local due = deadline(ARGV[1], 6, server)
if due > server then log.claim(4, 'A', due) end
local old = redis.call('ZSCORE', KEYS[2], string.sub(KEYS[1], #KEYS[2]))
lru().remove(old and tonumber(old))
return 1
