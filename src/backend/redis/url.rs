//! Multi-node URLs (`redis+cluster://`, `redis+sentinel://`, `redlock://`):
//! `<scheme>[user:password@]host:port,host:port[/path]`, read the same way by the Cluster and
//! Sentinel builders and by Redlock.

#[cfg(any(feature = "redis-cluster", feature = "redlock"))]
use crate::error::{Error, Result};

/// The parts of a multi-node URL.
pub(crate) struct MultiNode<'a> {
    /// `user:password`, or only a password.
    pub(crate) auth: Option<&'a str>,
    /// `host:port` each, as given.
    pub(crate) hosts: Vec<&'a str>,
    /// What follows the first `/` after the hosts: the database, or a Sentinel's master name.
    pub(crate) path: Option<&'a str>,
}

/// Splits `url` into its credentials, hosts and path; `None` unless it starts with `scheme`.
pub(crate) fn multi_node<'a>(url: &'a str, scheme: &str) -> Option<MultiNode<'a>> {
    let rest = url.strip_prefix(scheme)?;
    let (auth, rest) = match rest.rsplit_once('@') {
        Some((auth, rest)) => (Some(auth), rest),
        None => (None, rest),
    };
    let (hosts, path) = match rest.split_once('/') {
        Some((hosts, path)) => (hosts, Some(path)),
        None => (rest, None),
    };
    Some(MultiNode {
        auth,
        hosts: hosts.split(',').filter(|h| !h.is_empty()).collect(),
        path,
    })
}

/// The `redis://` URLs of the nodes of `<scheme>[user:password@]host:port,host:port[/db]`,
/// each with the credentials and database.
#[cfg(any(feature = "redis-cluster", feature = "redlock"))]
pub(crate) fn hosts_of(url: &str, scheme: &str) -> Result<Vec<String>> {
    let nodes = multi_node(url, scheme)
        .ok_or_else(|| Error::invalid_config(format_args!("the url must start with `{scheme}`")))?;
    let auth = nodes.auth.map(|a| format!("{a}@")).unwrap_or_default();
    let db = nodes
        .path
        .map_or_else(|| "/".to_owned(), |db| format!("/{db}"));
    Ok(nodes
        .hosts
        .iter()
        .map(|h| format!("redis://{auth}{h}{db}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_credentials_hosts_and_path() {
        let n = multi_node(
            "redis+sentinel://u:p@a:1,,b:2/master/3",
            "redis+sentinel://",
        )
        .expect("the scheme matches");
        assert_eq!(n.auth, Some("u:p"));
        assert_eq!(n.hosts, ["a:1", "b:2"]);
        assert_eq!(n.path, Some("master/3"));
        let n = multi_node("redlock://a:1", "redlock://").expect("the scheme matches");
        assert_eq!((n.auth, n.path), (None, None));
        assert!(multi_node("redis://a:1", "redlock://").is_none());
    }

    #[cfg(any(feature = "redis-cluster", feature = "redlock"))]
    #[test]
    fn node_urls_carry_credentials_and_database() {
        let urls = hosts_of("redlock://:pw@a:1,b:2/4", "redlock://").expect("well formed");
        assert_eq!(urls, ["redis://:pw@a:1/4", "redis://:pw@b:2/4"]);
        let urls = hosts_of("redlock://a:1", "redlock://").expect("well formed");
        assert_eq!(urls, ["redis://a:1/"]);
        assert!(hosts_of("redis://a:1", "redlock://").is_err());
    }
}
