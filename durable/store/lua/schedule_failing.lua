-- Note on a schedule's record why its passes fail ("<ms>|<error>"), or clear the note (ARGV[1]
-- empty). A schedule deleted meanwhile is not made again as a record holding only the note.
-- KEYS: record
-- ARGV: note
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[1] == '' then return redis.call('HDEL', KEYS[1], 'failing') end
return redis.call('HSET', KEYS[1], 'failing', ARGV[1])
