-- Delete hook tokens whose run is gone (purged): one bounded HSCAN step of the
-- partition's hooks hash. A token of a run that still exists is kept.
-- KEYS: hooks
-- ARGV: HSCAN cursor ('0' starts over), count, dry ('1': count, delete nothing)
-- Returns {next cursor ('0': the scan is complete), tokens deleted (or found)}
local hooks, cursor, count, dry = KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'
local tag = string.match(hooks, '^(.-{%d+})')
local reply = redis.call('HSCAN', hooks, cursor, 'COUNT', count)
local items, gone = reply[2], 0
for i = 1, #items, 2 do
  local rid = string.match(items[i + 1], '^([^|]+)|')
  if rid and redis.call('EXISTS', tag .. ':run:' .. rid) == 0 then
    if not dry then redis.call('HDEL', hooks, items[i]) end
    gone = gone + 1
  end
end
return {reply[1], gone}
