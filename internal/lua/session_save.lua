-- session_save.lua: publish a session as the new head if the stored head is
-- at the version the writer last saw.
--
-- uses: oplog
--
-- KEYS[1]  <ns>:{<ns>:<id>}:head  hash  version v; snapshot d, or journal header h and message count n
-- KEYS[2]  <ns>:{<ns>:<id>}:log   list  the journal's messages, oldest first
-- KEYS[3]  <ns>:{<ns>:<id>}:q:<op> string  this call's answer key (oplog.lua)
-- ARGV[1]  expected head version, decimal ("0": no head yet)
-- ARGV[2]  "snapshot", "append" or "rewrite"
-- ARGV[3]  idle TTL of the session, milliseconds; "0" keeps it
-- ARGV[4]  the session document: the whole session (snapshot) or its header
--          without messages (journal), JSON
-- ARGV[5]  the journal's message count after this save ("0" for snapshot)
-- ARGV[6]  this call's op (oplog.lua): 9 bytes
-- ARGV[7+] messages to push (append: the new ones; rewrite: all)
--
-- A session expires on the server's clock: head and log carry the TTL, and
-- a head Redis has expired is no head.
--
-- A save that publishes stores the version it wrote in its answer key until
-- its deadline (oplog.lua), and a copy that finds it answers that version.
-- No run changes anything after the call's deadline.
--
-- Reply: array
--   {"ok", new version}       published (a re-sent save that published
--                             answers the version it wrote, oplog.lua)
--   {"conflict", version}     the head is at another version: nothing written
--   {"rewrite", version}      append refused: the stored journal does not
--                             hold the messages the writer extends (send a
--                             rewrite); nothing written
--   {"expired", server clock} no run of this call published and its deadline
--                             has passed: nothing written (the clock in ms
--                             since 2025-01-01, an integer)

local log = oplog()
local server = log.now()
local done = redis.call('GET', KEYS[3])
if done then return {'ok', done} end -- an earlier run published
local due = deadline(ARGV[6], 6, server)
if due <= server then
  return {'expired', server}
end
local head = redis.call('HMGET', KEYS[1], 'v', 'n')
local stored = head[1] or '0'
if stored ~= ARGV[1] then
  return {'conflict', stored}
end
local mode = ARGV[2]
local count = tonumber(ARGV[5])
local pushed = #ARGV - 6
if mode == 'append' then
  local have = tonumber(head[2] or '-1')
  if have ~= count - pushed or redis.call('LLEN', KEYS[2]) ~= have then
    return {'rewrite', stored}
  end
end
local version = string.format('%.0f', tonumber(stored) + 1)
log.claim(3, version, due)
if mode ~= 'append' then
  redis.call('DEL', KEYS[2])
end
-- Push in slices: unpack is bounded by the Lua stack.
for first = 7, #ARGV, 1000 do
  redis.call('RPUSH', KEYS[2], unpack(ARGV, first, math.min(first + 999, #ARGV)))
end

if mode == 'snapshot' then
  redis.call('HDEL', KEYS[1], 'h', 'n')
  redis.call('HSET', KEYS[1], 'v', version, 'd', ARGV[4])
else
  redis.call('HDEL', KEYS[1], 'd')
  redis.call('HSET', KEYS[1], 'v', version, 'h', ARGV[4], 'n', ARGV[5])
end
for i = 1, 2 do
  if ARGV[3] ~= '0' then
    redis.call('PEXPIRE', KEYS[i], ARGV[3])
  else
    redis.call('PERSIST', KEYS[i])
  end
end
return {'ok', version}
