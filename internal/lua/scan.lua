-- scan.lua: one step of SCAN on the server that holds a partition, for
-- Audit. A client library sends a script to the node serving its keys, so
-- this reaches a partition's states wherever a cluster put them, without
-- asking the library which node that is. It changes nothing.
--
-- uses: none
-- flags: no-writes
--   (as a Redis function: it reads only, so it runs when the server is out of memory)
--
-- KEYS[1]  <ns>:{<ns>:<pp>}:lru  zset  the partition's LRU (lru.lua); only
--          names the node
-- ARGV[1]  SCAN cursor: "0" to start
-- ARGV[2]  MATCH pattern
-- ARGV[3]  COUNT hint
--
-- Reply: array {next cursor ("0" when done), array of key names}

return redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', ARGV[3])
