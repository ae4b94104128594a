-- Purge closed runs of one partition: every key of each run (record, history, inbox, updates,
-- activities, log), its entries in the runs, closed and search indexes, and the instance record
-- when the run is still the instance's current one. An open run is never touched.
-- Bounded: at most `limit` runs per call (callers loop). Keys go by UNLINK, which
-- frees a big history's memory in a background thread instead of inside the script.
-- KEYS: closed index, runs index, blocked index
-- ARGV: mode ('due': runs whose retention has ended, from the closed index;
--       'ids': the run ids that follow), limit, run ids...
-- Returns {runs purged, instance records removed, open runs skipped}
local closed, runs = KEYS[1], KEYS[2]
local mode, limit = ARGV[1], tonumber(ARGV[2])
local tag = string.match(closed, '^(.-{%d+})')
local ids = {}
if mode == 'due' then
  ids = redis.call('ZRANGEBYSCORE', closed, '-inf', real_now_ms(), 'LIMIT', 0, limit)
else
  for i = 3, math.min(#ARGV, limit + 2) do ids[#ids + 1] = ARGV[i] end
end
local purged, instances, skipped = 0, 0, 0
for _, rid in ipairs(ids) do
  local run = tag .. ':run:' .. rid
  local f = redis.call('HMGET', run, 'status', 'workflow_id')
  if is_open(f[1]) then
    -- Never purged; an open run has no business in the closed index either.
    redis.call('ZREM', closed, rid)
    skipped = skipped + 1
  else
    sx_drop(run, rid)
    redis.call('UNLINK', run, tag .. ':h:' .. rid, tag .. ':in:' .. rid, tag .. ':act:' .. rid,
      tag .. ':log:' .. rid, tag .. ':upd:' .. rid)
    redis.call('ZREM', runs, rid)
    redis.call('ZREM', closed, rid)
    redis.call('ZREM', KEYS[3], rid)
    if f[2] then
      local instance = tag .. ':wf:' .. f[2]
      if redis.call('HGET', instance, 'run') == rid then
        redis.call('UNLINK', instance)
        instances = instances + 1
      end
    end
    purged = purged + 1
  end
end
return {purged, instances, skipped}
