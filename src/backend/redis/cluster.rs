//! Redis Cluster: the seed nodes of a `redis+cluster://` URL and the command connection, which
//! routes each script to the primary serving its keys' slot and follows `MOVED` and failovers.

use ::redis::cluster::ClusterClientBuilder;
use ::redis::cluster_async::ClusterConnection;

use super::commands::{redis_error, CALL_TIMEOUT};
use crate::error::{Error, Result};

/// The scheme of a Cluster URL.
pub(crate) const SCHEME: &str = "redis+cluster://";

/// Whether `url` names a Redis Cluster.
pub(crate) fn is_cluster_url(url: &str) -> bool {
    url.starts_with(SCHEME)
}

/// Connects the command connection to the cluster seeded by `seeds` (`redis://host:port`).
pub(crate) async fn connect(seeds: &[String]) -> Result<ClusterConnection> {
    ClusterClientBuilder::new(seeds.to_vec())
        .connection_timeout(CALL_TIMEOUT)
        .response_timeout(CALL_TIMEOUT)
        .retries(3)
        .build()
        .map_err(|e| Error::invalid_config("malformed redis cluster url").with_source(e))?
        .get_async_connection()
        .await
        .map_err(|e| redis_error("cluster connect", e))
}
