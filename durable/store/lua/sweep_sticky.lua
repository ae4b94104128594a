-- Hand back the workflow tasks that waited too long, unread, in workers' private (sticky)
-- streams (like Temporal's sticky schedule-to-start timeout). Their worker died (its lease
-- lives on until --claim-idle runs out) or is stuck; any worker can decide the run from its
-- history instead. Entries the owner has read (its consumer group's last-delivered id is past
-- them) stay: it is deciding them (its own reclaim retries one it could not finish, e.g. a
-- commit refused at maxmemory), and unstick.lua moves them once its lease lapses.
-- Stream entry ids are Redis-time milliseconds: an entry's id says how long it has waited.
-- A stopping worker sweeps its own stream with timeout 0 while it finishes its activities:
-- tasks for its runs (their results, signals) go to the runs' queues at once, and the runs stop
-- being sticky to it, instead of waiting there for the timeout.
-- KEYS: sticky hosts set (T:sticky)
-- ARGV: timeout ms, most tasks to move in this call, only this host ('' : every host)
-- Returns {tasks moved, ms until the oldest unread task left times out (-1: none waits)}
local hosts, timeout, limit, only = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3] or ''
local tag = string.match(hosts, '^(.-{%d+})')
local now = real_now_ms()
local cutoff = now - timeout
local moved, next_in = 0, -1

-- The id after which the owner has read nothing yet ('0-0': it read nothing).
local function last_read(stream)
  for _, group in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local name, last = nil, nil
    for i = 1, #group, 2 do
      if group[i] == 'name' then name = group[i + 1] end
      if group[i] == 'last-delivered-id' then last = group[i + 1] end
    end
    if name == GROUP then return last end
  end
  return '0-0'
end

for _, host in ipairs(redis.call('SMEMBERS', hosts)) do
  local stream = tag .. ':wq:' .. host
  if (only == '' or host == only) and redis.call('EXISTS', stream) == 1 then
    local after = '(' .. last_read(stream)
    if moved < limit and cutoff >= 0 then
      for _, entry in ipairs(redis.call('XRANGE', stream, after, string.format('%d', cutoff), 'COUNT', limit - moved)) do
        local rid = entry_run(entry)
        if rid ~= '' then moved = moved + hand_back(tag, host, rid) end
        redis.call('XDEL', stream, entry[1])
      end
    end
    local oldest = redis.call('XRANGE', stream, after, '+', 'COUNT', 1)[1]
    if oldest then
      local ms = tonumber(string.sub(oldest[1], 1, string.find(oldest[1], '-', 1, true) - 1))
      local wait = math.max(0, ms + timeout - now)
      if next_in < 0 or wait < next_in then next_in = wait end
    end
  end
end
return {moved, next_in}
