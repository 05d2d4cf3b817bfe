-- schema.lua: record a namespace's schema the first time a store opens it,
-- and return what is recorded.
--
-- uses: oplog
--
-- KEYS[1]  <ns>:{<ns>}:meta  hash  the namespace's schema
-- ARGV[1]  schema version of the opening store
-- ARGV[2]  partition count of the opening store
-- ARGV[3]  fingerprint profile id of the opening store
-- ARGV[4]  fingerprint key the opening store proposes: 64 lowercase hex digits
--
-- Reply: array {schema version, partition count, profile id, key} as
-- recorded (strings; a field the namespace lacks is nil), then the server
-- clock in milliseconds since 2025-01-01 (integer), from which a store
-- takes its first estimate of its servers' clocks (oplog.lua).

if redis.call('HSETNX', KEYS[1], 'schema', ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], 'partitions', ARGV[2], 'profile', ARGV[3], 'key', ARGV[4])
end
local got = redis.call('HMGET', KEYS[1], 'schema', 'partitions', 'profile', 'key')
local now = redis.call('TIME')
got[5] = (now[1] - EPOCH_S) * 1000 + (now[2] - now[2] % 1000) / 1000
return got
