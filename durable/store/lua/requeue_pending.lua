-- Put back the tasks a leaving worker was delivered but never took: entries its blocking
-- read received while the process was stopping or stuck (they sat unread on a dropped
-- connection). Each goes back to the end of its stream as a new entry, for any worker,
-- instead of waiting out --claim-idle; the original is acked and deleted, in one step.
-- After a Redis outage a worker that goes on puts back the same way what the outage hid from
-- it (a commit or a read whose reply was lost), keeping the entries it does hold.
-- An activity attempt this worker began goes back marked `<aid>:handed` ("<worker>|<why>") in
-- its run's activities hash (same partition): its next begin is not counted as a worker's death
-- (workers/crash_loops.py), and is logged as handed back, not as lost.
-- KEYS: task stream
-- ARGV: consumer group, consumer, most entries to move, why (in words), then the entry ids to keep
-- Returns the number of tasks moved.
local stream, group, consumer, most, why = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local keep = {}
for i = 5, #ARGV do keep[ARGV[i]] = true end
local tag = string.match(stream, '^(.*):aq:')

local function mark_handed(fields)
  local rid, aid
  for i = 1, #fields, 2 do
    if fields[i] == 'run' then rid = fields[i + 1] elseif fields[i] == 'act' then aid = fields[i + 1] end
  end
  if not (tag and rid and aid) then return end
  local acts = tag .. ':act:' .. rid
  local began = redis.call('HGET', acts, aid .. ':worker') or ''
  if string.find(began, '|' .. consumer .. '|', 1, true) then
    redis.call('HSET', acts, aid .. ':handed', consumer .. '|' .. why)
  end
end

local ok, pending = pcall(redis.call, 'XPENDING', stream, group, '-', '+', most, consumer)
if not ok then return 0 end -- no such stream or group: nothing was delivered
local moved = 0
for _, row in ipairs(pending) do
  local id = row[1]
  if not keep[id] then
    local found = redis.call('XRANGE', stream, id, id)
    redis.call('XACK', stream, group, id)
    if #found == 1 then
      mark_handed(found[1][2])
      redis.call('XADD', stream, '*', unpack(found[1][2]))
      redis.call('XDEL', stream, id)
      moved = moved + 1
    end
  end
end
return moved
