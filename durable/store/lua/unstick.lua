-- Hand the workflow tasks waiting in a stopped worker's private stream back to
-- their runs' queues, where any worker takes them (its cached drivers are gone).
-- A no-op while the worker's lease is alive: it is only slow, not gone.
-- KEYS: private stream (T:wq:@host), the host's lease (T:alive:@host), sticky hosts set
-- ARGV: host (the private queue name, '@...')
-- Returns the number of tasks moved, or -1 when the host is alive.
local stream, alive, hosts, host = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
if redis.call('EXISTS', alive) == 1 then return -1 end
local tag = string.match(stream, '^(.-{%d+})')
local moved = 0
-- Delivered-but-unacked entries are still in the stream: they move too (their
-- decider is gone; were it only slow, the commit's seq check stops the loser).
for _, entry in ipairs(redis.call('XRANGE', stream, '-', '+')) do
  local rid = entry_run(entry)
  if rid ~= '' then moved = moved + hand_back(tag, host, rid) end
end
redis.call('DEL', stream)
redis.call('SREM', hosts, host)
return moved
