-- prune.lua: evict idle owners, then the least recently touched while a
-- partition is over its limits (lru.lua), for a maintenance sweep.
--
-- uses: oplog, lru
-- flags: allow-oom
--   (as a Redis function: it frees memory, so it runs when the server is out of memory)
--
-- KEYS[1]  <ns>:{<ns>:<pp>}:lru   zset  the partition's LRU (lru.lua)
-- KEYS[2]  <ns>:{<ns>:<pp>}:part  hash  the partition's accounting
-- DELETES  <ns>:{<ns>:<pp>}:o:<member>  hash  the state of each owner it evicts
--          (lru.lua prune), not in KEYS: named by ARGV[2] followed by the owner's
--          LRU member. Safe in Redis Cluster: ARGV[2] is the state-key prefix
--          of this partition, whose hash tag {<ns>:<pp>} the keys above share,
--          so the name is in their slot.
-- WRITES   <ns>:{<ns>:<pp>}:q:<member>:<op>  string  the answer key of a call
--          whose answer it moves out of an evicted state (oplog.lua),
--          not in KEYS: named by ARGV[2]'s partition prefix, the owner's LRU
--          member and the op. Safe in Redis Cluster: the name has the
--          hash tag {<ns>:<pp>} of the keys above, so it is in their slot.
-- ARGV[1]  idle TTL of an owner's state, milliseconds
-- ARGV[2]  the partition's prefix of owner state keys: "<ns>:{<ns>:<pp>}:o:"
-- ARGV[3]  limits (lru.lua prune): "<partition's owner limit>:<partition's
--          stored-bytes limit>:<most evictions this call may make>"
--
-- Reply: array of integers: evictions by cause {ttl, owners, bytes}. A total
-- equal to the eviction budget (ARGV[3]) means more may remain.

local _, n = prune(KEYS[1], KEYS[2], ARGV[2], false,
  lru().idle(ARGV[1]), ARGV[3],
  redis.call('ZCARD', KEYS[1]), tonumber(redis.call('HGET', KEYS[2], 'bytes') or '0'), spills().releaser(oplog().now()))
return n
