//! The node list of a multi-node URL (`redis+cluster://`, `redlock://`), shared by the Cluster
//! builder and Redlock.

use crate::error::{Error, Result};

/// The `redis://` URLs of the nodes of `<scheme>[user:password@]host:port,host:port[/db]`,
/// each with the credentials and database.
#[cfg(any(feature = "redis-cluster", feature = "redlock"))]
pub(crate) fn hosts_of(url: &str, scheme: &str) -> Result<Vec<String>> {
    let rest = url
        .strip_prefix(scheme)
        .ok_or_else(|| Error::invalid_config(format_args!("the url must start with `{scheme}`")))?;
    let (auth, rest) = match rest.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), rest),
    };
    let (hosts, db) = match rest.split_once('/') {
        Some((hosts, db)) => (hosts, format!("/{db}")),
        None => (rest, "/".to_owned()),
    };
    Ok(hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("redis://{auth}{h}{db}"))
        .collect())
}
