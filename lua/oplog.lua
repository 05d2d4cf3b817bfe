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
--
-- A script reads what it needs and works out its answer first. When the
-- answer changes something, claim stores it before the first write, in
-- the same command that finds an earlier run's (SET NX GET); otherwise
-- answered looks for an earlier run that did change something.

-- answered returns the answer the first run of this operation stored, or
-- nil.
local function answered(key)
  return redis.call('GET', key) or nil
end

-- claim stores answer as this operation's, for ms milliseconds, unless an
-- earlier run stored one: it returns that earlier answer, or nil when this
-- run is the first and goes on to change what answer says.
local function claim(key, answer, ms)
  return redis.call('SET', key, answer, 'NX', 'GET', 'PX', ms) or nil
end
