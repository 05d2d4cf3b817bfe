-- oplog.lua: how a call that changes state answers its copies as its first
-- run did, and the scripts' epoch. It defines local constants and functions
-- only; every script that changes state or reads the clock names oplog in
-- its header's uses line, and is sent with this file before it (lua.go).
--
-- A client may send a call more than once: go-redis re-sends a command
-- whose reply was lost, and a delayed first copy may even run after the
-- second. So every such call carries an op (9 bytes): a random id (5
-- bytes), then the call's deadline (4 bytes, big-endian), the instant after
-- which its client waits for it no more, as the low 32 bits of a count of
-- milliseconds since 2025-01-01T00:00:00Z on the server's clock, at most an
-- hour after the call starts. A script reads a deadline as the instant with
-- those low bits in the 2^32 ms that end an hour after a time it knows
-- (deadline): exact for a call that began in the last 49 days. A call also
-- names a key of its own, its answer key, whose name ends in its op in
-- lowercase hex.
--
-- Until its deadline, the first run of a call that changed something leaves
-- its answer where the copies look:
--   - reserve and record, in the owner's state: its field o holds the op of
--     the reserve that made the current turn with its answer's flags (and a
--     byte of the refresh clock, reserve.lua), then the op of the last
--     record that published;
--   - the others (abort, clear, session_save), in the answer key, with
--     PXAT at the deadline (claim).
-- A script that overwrites or deletes a slot of o whose deadline has not
-- passed copies its answer to that call's answer key first (spills()), so
-- the state holds one reserve's and one record's answer and an answer key
-- lives only when calls on one owner come closer together than a deadline. A copy finds the answer in o, or else in its answer key.
-- After its deadline no copy changes anything: reserve, clear and
-- session_save refuse to run after theirs unless they find an earlier
-- run's answer, and record and abort are fenced by the owner's turn, which
-- their first run moved on. Clear, which no turn fences, keeps its answer
-- even when it changed nothing.

-- The scripts' epoch, 2025-01-01T00:00:00Z, in seconds and in milliseconds
-- since the Unix epoch: every clock value the scripts give counts from it.
local EPOCH_S = 1735689600
local EPOCH_MS = EPOCH_S * 1000

-- deadline returns the deadline whose low 32 bits are the 4 bytes of s at
-- position at, in milliseconds since 2025-01-01: the one no later than an
-- hour after near (in the same unit) and less than 2^32 ms before that.
local function deadline(s, at, near)
  local a, b, c, d = string.byte(s, at, at + 3)
  local diff = (((a * 256 + b) * 256 + c) * 256 + d - near) % 4294967296
  if diff > 3600000 then diff = diff - 4294967296 end
  return near + diff
end

-- answer_key returns the answer key of the op of s at position at (9
-- bytes): the owner's prefix "<ns>:{<ns>:<pp>}:q:<owner>:" and the op in
-- 18 lowercase hex digits.
local function answer_key(prefix, s, at)
  return prefix .. string.format('%02x%02x%02x%02x%02x%02x%02x%02x%02x', string.byte(s, at, at + 8))
end

-- oplog returns the clock and the claim of an answer key, as a table: now,
-- claim.
local function oplog()
  -- now returns the server clock in milliseconds since 2025-01-01.
  local function now()
    local t = redis.call('TIME')
    return (t[1] - EPOCH_S) * 1000 + (t[2] - t[2] % 1000) / 1000
  end

  -- claim stores answer as the answer of this call (its answer key
  -- KEYS[i]) until the deadline due, unless an earlier run stored one: it
  -- returns that earlier answer, or nil when this run is the first and goes
  -- on to change what answer says.
  local function claim(i, answer, due)
    return redis.call('SET', KEYS[i], answer, 'NX', 'GET', 'PXAT', string.format('%d', due + EPOCH_MS)) or nil
  end

  return {now = now, claim = claim}
end

-- spills returns the functions that move the answers a state holds to
-- their answer keys, as a table: reserve, record, all, releaser. Each
-- writes a key only for a call whose deadline is after now (ms since
-- 2025-01-01). prefix is the name of the owner's answer keys up to the op;
-- when nil, that of the owner whose state is KEYS[1]: the calling script's
-- own answer key (its fourth key) without its op in hex.
local function spills()
  -- spill stores answer in the answer key of the op of s at position at
  -- (9 bytes) until its deadline, when that is after now.
  local function spill(prefix, s, at, answer, now)
    prefix = prefix or string.sub(KEYS[4], 1, #KEYS[4] - 18)
    local due = deadline(s, at + 5, now)
    if due > now then
      redis.call('SET', answer_key(prefix, s, at), answer, 'PXAT', string.format('%d', due + EPOCH_MS))
    end
  end

  -- reserve keeps the answer of the reserve of state o (the state's turn t
  -- and continuation c).
  local function reserve(o, t, c, now, prefix)
    local flags = string.byte(o, 10) - 48
    local consumed = flags % 2 == 1 and t + 0 > 0 and c
    spill(prefix, o, 1, string.format('%d:%d', math.abs(t), (flags - flags % 2) / 2) ..
      (consumed and '1' .. c or '0'), now)
  end

  -- record keeps the answer of the record of state o, if any.
  local function record(o, now, prefix)
    if #o >= 20 then spill(prefix, o, 12, 'P', now) end
  end

  -- all keeps both answers of state o (turn t, continuation c).
  local function all(o, t, c, now, prefix)
    reserve(o, t, c, now, prefix)
    record(o, now, prefix)
  end

  -- releaser returns the function that prune (lru.lua) calls before it
  -- deletes the state key of an owner (its LRU member): it keeps the
  -- answers the state holds. The answer keys of the owner of
  -- "<ns>:{<ns>:<pp>}:o:<member>" start "<ns>:{<ns>:<pp>}:q:<member>:".
  local function releaser(now)
    return function(key, member)
      local v = redis.call('HMGET', key, 't', 'c', 'o')
      if v[1] and v[3] then
        all(v[3], v[1], v[2], now, string.sub(key, 1, #key - #member - 2) .. 'q:' .. member .. ':')
      end
    end
  end

  return {reserve = reserve, record = record, all = all, releaser = releaser}
end
