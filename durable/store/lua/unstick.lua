-- Hand the workflow tasks waiting in a stopped worker's private stream back to
-- their runs' queues, where any worker takes them (its cached drivers are gone),
-- and forget its private activity stream once nothing waits there.
-- A no-op while the worker's lease is alive: it is only slow, not gone.
-- KEYS: private stream (T:wq:@host), the host's lease (T:alive:@host), sticky hosts set,
--       private activity stream (T:aq:@host), session hosts set (T:sessions)
-- ARGV: host (the private queue name, '@...')
-- Returns the number of tasks moved, or -1 when the host is alive.
local stream, alive, hosts, host = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local activities, sessions = KEYS[4], KEYS[5]
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
-- Every worker creates its private activity stream (it reads it from the start), whether or
-- not a session ever used it: left alone, each worker that ever ran would leave one per
-- partition behind. Its entries (queued or delivered-but-unacked: acked ones are deleted)
-- can only run on this host, so they are not handed back: the host stays a session host,
-- whose tasks the scheduler fails (SessionLost) before it calls this again.
if redis.call('XLEN', activities) == 0 then
  redis.call('DEL', activities)
  redis.call('SREM', sessions, host)
else
  redis.call('SADD', sessions, host)
end
return moved
