-- oplog.lua: the answers that make a re-sent script answer as its first run
-- did. It defines local functions only; every script that changes state
-- names oplog in its header's uses line, and is sent with this file before
-- it (lua.go).
--
-- A client may send a script twice: go-redis re-sends a command whose reply
-- was lost, and a delayed first copy may even run after the second. Every
-- such script is called with a key of its own, named after its operation
-- (12 random hex digits, one per call), in the hash tag of the keys it
-- changes. A run that changes something stores its answer there, with a
-- TTL (how long a client may still re-send: seconds); a run that finds an
-- answer returns it and changes nothing. A run that changes nothing stores
-- nothing: a copy of it that runs later sees the state of its own time,
-- which is an answer the call may give. Memory is one small key per change,
-- for the TTL.

-- answered returns the answer the first run of this operation stored, or
-- nil.
local function answered(key)
  return redis.call('GET', key) or nil
end

-- remember stores answer as this operation's, for ms milliseconds.
local function remember(key, answer, ms)
  redis.call('SET', key, answer, 'PX', ms)
end
