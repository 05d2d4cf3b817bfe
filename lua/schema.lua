-- schema.lua: record a namespace's schema version and partition count the
-- first time a store opens it, and return what is recorded.
--
-- KEYS[1]  <ns>:{<ns>}:meta  hash  the namespace's schema
-- ARGV[1]  schema version of the opening store
-- ARGV[2]  partition count of the opening store
--
-- Reply: array {schema version, partition count} as recorded (strings).

redis.call('HSETNX', KEYS[1], 'schema', ARGV[1])
redis.call('HSETNX', KEYS[1], 'partitions', ARGV[2])
return redis.call('HMGET', KEYS[1], 'schema', 'partitions')
