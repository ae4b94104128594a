-- Delete consumers of a task stream's group that hold no pending entry. Every worker start adds
-- its consumer name to the group of each stream it reads and nothing removed them: after many
-- restarts the groups listed hundreds of dead consumers. XGROUP DELCONSUMER also drops the
-- consumer's pending entries (tasks would be lost), so a consumer that still holds some is
-- kept: XAUTOCLAIM moves them to a live worker after --claim-idle, and a later call deletes it.
-- KEYS: task stream
-- ARGV: mode ('only': the consumers named, a stopping worker's own; 'except': every consumer
--       not named, the named being the live workers), least idle ms (a consumer that read more
--       recently is kept: a worker that just started may not be named yet), most consumers to
--       delete, consumer names...
-- Returns {consumers deleted, consumers kept for their pending entries}
local stream, only, least_idle, most = KEYS[1], ARGV[1] == 'only', tonumber(ARGV[2]), tonumber(ARGV[3])
local named = {}
for i = 4, #ARGV do named[ARGV[i]] = true end
local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', stream, GROUP)
if not ok then return {0, 0} end -- no such stream or group: no consumer either
local deleted, held = 0, 0
for _, row in ipairs(consumers) do
  local c = {}
  for i = 1, #row, 2 do c[row[i]] = row[i + 1] end
  if (named[c.name] == true) == only and c.idle >= least_idle then
    if c.pending > 0 then
      held = held + 1
    elseif deleted < most then
      redis.call('XGROUP', 'DELCONSUMER', stream, GROUP, c.name)
      deleted = deleted + 1
    end
  end
end
return {deleted, held}
