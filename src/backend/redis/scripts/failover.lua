-- A primary that may fail over to a replica (Redis Cluster, Sentinel): tokens never fall below
-- server time in µs, since the promoted replica may have missed the last increments of the
-- fencing counter (replication is asynchronous).
Q.fence_floor = true
