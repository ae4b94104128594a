"""Everything in durable that talks to Redis: keys, scripts, the store and the embedded server."""
