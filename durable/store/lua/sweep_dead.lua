-- Delete dead letters older than a cutoff whose run is closed or gone: one bounded
-- step through the partition's dead-letter stream. A dead letter of an open run (a
-- blocked run waits for `durable repair`, which re-queues its parked tasks) is kept.
-- One step examines at most `count` entries, so the script stays short however many are due;
-- a caller that got a full batch back takes the next step (Purger._sweep_dead, within a
-- budget per pass; purge_closed_before until the cutoff).
-- KEYS: dead
-- ARGV: start ('-' or an exclusive '(<id>'), count, cutoff ms ('' = now minus the
--       namespace's retention), dry ('1': count, delete nothing)[, workflow type: only dead
--       letters of closed runs of that type (a purge scoped to a type took every type's)]
-- Returns {last entry id seen ('' = the scan reached the cutoff), letters deleted (or found)}
local dead, start, count, dry = KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[4] == '1'
local only = ARGV[5] or ''
local tag = string.match(dead, '^(.-{%d+})')
local cutoff = tonumber(ARGV[3])
if cutoff == nil then cutoff = real_now_ms() - namespace_retention_ms(tag) end
local rows = redis.call('XRANGE', dead, start, '(' .. cutoff .. '-0', 'COUNT', count)
local gone = 0
for _, row in ipairs(rows) do
  local f, rid = row[2], ''
  for i = 1, #f, 2 do if f[i] == 'run' then rid = f[i + 1] end end
  local status, kind = unpack(rid ~= '' and redis.call('HMGET', tag .. ':run:' .. rid, 'status', 'type') or {})
  if (only == '' or kind == only) and (rid == '' or not is_open(status)) then
    if not dry then redis.call('XDEL', dead, row[1]) end
    gone = gone + 1
  end
end
local last = ''
if #rows == count then last = rows[#rows][1] end
return {last, gone}
