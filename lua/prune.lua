-- prune.lua: evict idle owners, then the least recently touched while a
-- partition is over its limits (lru.lua), for a maintenance sweep.
--
-- KEYS[1]  <ns>:{<ns>:<pp>}:lru   zset  the partition's LRU (lru.lua)
-- KEYS[2]  <ns>:{<ns>:<pp>}:part  hash  the partition's sequence and accounting
-- ARGV[1]  idle TTL of an owner's state, milliseconds
-- ARGV[2]  the partition's owner limit
-- ARGV[3]  the partition's stored-bytes limit
-- ARGV[4]  most evictions this call may make
--
-- Reply: array of integers: evictions by cause {ttl, owners, bytes}. A total
-- equal to ARGV[4] means more may remain.

local a = open_partition(KEYS[2])
prune(a, KEYS[1], false, now_ms(), tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]))
close_partition(a)
return {a.evicted.ttl, a.evicted.owners, a.evicted.bytes}
