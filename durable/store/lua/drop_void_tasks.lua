-- Drop the tasks of closed or purged runs from the head of a task stream no live worker
-- serves: a worker would drop each as void when it read it, but none reads this queue, so
-- they stayed, and its backlog counted them, for ever. Bounded: the first ARGV[2] entries.
-- An entry without a run id is left for a worker to park.
-- KEYS: task stream
-- ARGV: partition key tag, most entries looked at
-- Returns how many were dropped
local stream, tag, most = KEYS[1], ARGV[1], tonumber(ARGV[2])
local dropped = 0
for _, entry in ipairs(redis.call('XRANGE', stream, '-', '+', 'COUNT', most)) do
  local fields, rid = entry[2], nil
  for i = 1, #fields, 2 do
    if fields[i] == 'run' then rid = fields[i + 1] end
  end
  if rid and not is_open(redis.call('HGET', tag .. ':run:' .. rid, 'status')) then
    ack(stream, entry[1])
    dropped = dropped + 1
  end
end
return dropped
