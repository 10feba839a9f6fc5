-- Redis Cluster: a grant is announced on the lock's shard channel (it shares the lock's hash
-- tag, so its slot), heard by the one shard that serves it instead of broadcast to every node;
-- and tokens never fall below server time in µs, since a failover may promote a replica that
-- missed the last increments of the fencing counter.
Q.publish = function(channel, message) redis.call('SPUBLISH', channel, message) end
Q.fence_floor = true
