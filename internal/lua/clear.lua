-- clear.lua: remove an owner's state whatever its turn.
--
-- A run keeps its answer, "C" when it removed a live state, else "0", in
-- its answer key until its deadline, and the answers the state holds
-- (oplog.lua); a copy that finds it answers as the first run did and leaves
-- a turn reserved after it alone. No run changes anything after the call's
-- deadline.
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
--
-- Reply: integer
--   1  the owner had live state and it is removed
--   0  it had none: with neither state nor LRU entry only the answer is
--      written (the accounting is not touched); the entry of an expired
--      state is removed all the same
-- or, when no run of this call answered and its deadline has passed, the
-- array {"expired", the server clock in milliseconds since 2025-01-01}:
-- nothing changed.

local log = oplog()
local server = log.now()
local done = redis.call('GET', KEYS[4])
if done then return done == 'C' and 1 or 0 end -- an earlier run's answer
local due = deadline(ARGV[1], 6, server)
if due <= server then return {'expired', server} end
local old = redis.call('ZSCORE', KEYS[2], string.sub(KEYS[1], #KEYS[2]))
local st = redis.call('HMGET', KEYS[1], 't', 'c', 'o')
if old then old = tonumber(old) end
local change = lru()
local live = st[1] and true or false
-- The answer is kept whatever it is: no turn fences a clear, so a copy
-- that found none would remove a turn reserved after the first run.
log.claim(4, live and 'C' or '0', due)
if live then
  if st[3] then spills().all(st[3], st[1], st[2], server) end
  change.remove(old)
  return 1
end
if old or st[1] then
  -- the entry of an expired state goes all the same
  change.remove(old)
end
return 0
