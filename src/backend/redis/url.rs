//! Redis URLs: multi-node ones (`redis+cluster://`, `redis+sentinel://`, `redlock://`),
//! `<scheme>[user:password@]host:port,host:port[/path]`, read the same way by the Cluster and
//! Sentinel builders and by Redlock; and a malformed one of any kind, said in our words.

use crate::error::Error;
#[cfg(any(feature = "redis-cluster", feature = "redlock"))]
use crate::error::Result;

/// The parts of a multi-node URL.
#[cfg(any(
    feature = "redis-cluster",
    feature = "redis-sentinel",
    feature = "redlock"
))]
pub(crate) struct MultiNode<'a> {
    /// `user:password`, or only a password.
    pub(crate) auth: Option<&'a str>,
    /// `host:port` each, as given.
    pub(crate) hosts: Vec<&'a str>,
    /// What follows the first `/` after the hosts: the database, or a Sentinel's master name.
    pub(crate) path: Option<&'a str>,
}

/// Splits `url` into its credentials, hosts and path; `None` unless it starts with `scheme`.
#[cfg(any(
    feature = "redis-cluster",
    feature = "redis-sentinel",
    feature = "redlock"
))]
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

/// `what` (`redis url`, …) is malformed, in our words: redis-rs's description of the fault
/// followed by its kind (`Missing hostname - InvalidClientConfig`) says nothing the message
/// does not, so it is not kept as the source.
pub(crate) fn malformed_url(what: &str, e: &::redis::RedisError) -> Error {
    let described = e.to_string();
    let why = match described.split(" - ").next().unwrap_or_default() {
        "Redis URL did not parse" => {
            "not a URL of the form redis://[user:password@]host[:port][/db]".to_owned()
        }
        "Missing hostname" => "it names no host (redis://host[:port])".to_owned(),
        "Invalid database number" => "the database after the host is not a number".to_owned(),
        "Invalid protocol version" => "protocol= takes 2, 3, resp2 or resp3".to_owned(),
        "URL provided is not a redis URL" => "not a redis:// or rediss:// URL".to_owned(),
        "can't connect with TLS, the feature is not enabled" => {
            "rediss:// needs distlock's `redis-tls` feature, which this build lacks".to_owned()
        }
        "Cannot connect to a wildcard address (0.0.0.0 or ::)" => {
            "0.0.0.0 and :: are listening addresses; name the server's host".to_owned()
        }
        "Missing path" => "a unix socket URL names the socket's path".to_owned(),
        "Username is not valid UTF-8 string" => "the user name is not UTF-8".to_owned(),
        "Password is not valid UTF-8 string" => "the password is not UTF-8".to_owned(),
        "only #insecure is supported as URL fragment" => {
            "the only fragment a rediss:// URL takes is #insecure".to_owned()
        }
        // One we have no words for: redis-rs's description, without its kind's name.
        other => e
            .detail()
            .map_or_else(|| other.to_owned(), |detail| format!("{other}: {detail}")),
    };
    Error::invalid_config(format_args!("malformed {what}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(any(
        feature = "redis-cluster",
        feature = "redis-sentinel",
        feature = "redlock"
    ))]
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

    #[test]
    fn a_malformed_url_is_said_in_our_words_once() {
        for (url, why) in [
            ("redis://", "names no host"),
            ("redis://:6379", "not a URL of the form"),
            ("redis://127.0.0.1:6379/x", "not a number"),
            ("redis://0.0.0.0:6379", "listening addresses"),
        ] {
            let e = ::redis::Client::open(url).expect_err(url);
            let err = malformed_url("redis url", &e);
            let text = err.to_string();
            assert!(text.contains(why), "{url}: {text}");
            assert!(!text.contains("InvalidClientConfig"), "{url}: {text}");
            assert!(err.is_invalid_config() && std::error::Error::source(&err).is_none());
        }
    }
}
