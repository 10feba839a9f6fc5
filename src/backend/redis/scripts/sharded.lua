-- Redis Cluster: a grant is announced on the lock's shard channel (it shares the lock's hash
-- tag, so its slot), heard by the one shard that serves it instead of broadcast to every node.
Q.publish = function(channel, message) return redis.call('SPUBLISH', channel, message) end
