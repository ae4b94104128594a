-- Put back the tasks a leaving worker was delivered but never took: entries its blocking
-- read received while the process was stopping or stuck (they sat unread on a dropped
-- connection). Each goes back to the end of its stream as a new entry, for any worker,
-- instead of waiting out --claim-idle; the original is acked and deleted, in one step.
-- After a Redis outage a worker that goes on puts back the same way what the outage hid from
-- it (a commit or a read whose reply was lost), keeping the entries it does hold.
-- KEYS: task stream
-- ARGV: consumer group, consumer, most entries to move, then the entry ids to keep
-- Returns the number of tasks moved.
local stream, group, consumer, most = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local keep = {}
for i = 4, #ARGV do keep[ARGV[i]] = true end
local ok, pending = pcall(redis.call, 'XPENDING', stream, group, '-', '+', most, consumer)
if not ok then return 0 end -- no such stream or group: nothing was delivered
local moved = 0
for _, row in ipairs(pending) do
  local id = row[1]
  if not keep[id] then
    local found = redis.call('XRANGE', stream, id, id)
    redis.call('XACK', stream, group, id)
    if #found == 1 then
      redis.call('XADD', stream, '*', unpack(found[1][2]))
      redis.call('XDEL', stream, id)
      moved = moved + 1
    end
  end
end
return moved
