-- session_save.lua: publish a session as the new head if the stored head is
-- at the version the writer last saw.
--
-- uses: oplog
--
-- KEYS[1]  <ns>:{<ns>:<id>}:head  hash  version v; snapshot d, or journal header h and message count n
-- KEYS[2]  <ns>:{<ns>:<id>}:log   list  the journal's messages, oldest first
-- KEYS[3]  <ns>:{<ns>:<id>}:q:<op> string  this operation's answer (oplog.lua)
-- ARGV[1]  expected head version, decimal ("0": no head yet)
-- ARGV[2]  "snapshot", "append" or "rewrite"
-- ARGV[3]  idle TTL of the session, milliseconds; "0" keeps it
-- ARGV[4]  the session document: the whole session (snapshot) or its header
--          without messages (journal), JSON
-- ARGV[5]  the journal's message count after this save ("0" for snapshot)
-- ARGV[6]  how long the answer stays, milliseconds
-- ARGV[7+] messages to push (append: the new ones; rewrite: all)
--
-- Reply: array
--   {"ok", new version}       published (a re-sent save that published
--                             answers the version it wrote, oplog.lua)
--   {"conflict", version}     the head is at another version: nothing written
--   {"rewrite", version}      append refused: the stored journal does not
--                             hold the messages the writer extends (send a
--                             rewrite); nothing written

-- refused answers status, or the version an earlier run of this save
-- wrote.
local function refused(status, stored)
  local done = answered(KEYS[3])
  if done then return {'ok', done} end
  return {status, stored}
end

local stored = redis.call('HGET', KEYS[1], 'v') or '0'
if stored ~= ARGV[1] then
  return refused('conflict', stored)
end
local mode = ARGV[2]
local count = tonumber(ARGV[5])
local pushed = #ARGV - 6
if mode == 'append' then
  local have = tonumber(redis.call('HGET', KEYS[1], 'n') or '-1')
  if have ~= count - pushed or redis.call('LLEN', KEYS[2]) ~= have then
    return refused('rewrite', stored)
  end
end
local version = string.format('%.0f', tonumber(stored) + 1)
local done = claim(KEYS[3], version, ARGV[6])
if done then
  return {'ok', done}
end
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
