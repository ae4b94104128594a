-- Delete the workflow task stream of a retired build of a queue (no live worker serves the
-- build, and it is not the queue's current build) if it holds no task. Each deploy with a new
-- build id added one such stream per partition, with its group and the dead workers' consumers,
-- and nothing removed them. A stream that still holds tasks is kept: its runs wait for a worker
-- of their build (describe says so). A task added later recreates the stream; the group is
-- created from id 0 by the next worker of that build, so none is lost (or `durable repair ID
-- --build-id NEW` moves its run to another build).
-- KEYS: the stream
-- Returns 1 (deleted, or there was none) or 0 (kept: it holds tasks)
if redis.call('XLEN', KEYS[1]) > 0 then return 0 end
redis.call('DEL', KEYS[1])
return 1
