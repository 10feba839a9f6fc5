//! The `distlock` schema: its SQL, its version, and installing it on first use.

use tokio_postgres::Client;

use super::commands::pg_error;
use crate::error::{Error, ErrorKind, Result};

/// The schema version this build speaks: 2 added elections (a claim's value, their functions
/// and notifications) and changed how handoff hints reach past dead waiters; 3 made an
/// election's handed-on grant provisional (a claim's `provisional`) until its candidate
/// confirms it, so only a confirmed leader is reported and announced.
pub(crate) const VERSION: i32 = 3;

/// The SQL that creates the schema (tables, functions, version row), for one transaction.
pub(crate) const SQL: &str = include_str!("schema.sql");

/// The oldest server the schema runs on (`server_version_num`).
const MIN_SERVER: i32 = 120_000;

/// An advisory lock key that serialises concurrent installs ("distlock" in ASCII).
const INSTALL_LOCK: i64 = 0x0064_6973_746c_6f63;

/// Checks the server and the schema on `client`, installing the schema if it is missing and
/// `create` allows it.
pub(crate) async fn ensure(client: &Client, create: bool) -> Result<()> {
    let row = client
        .query_typed_one(
            "SELECT current_setting('server_version_num')::int4, current_setting('server_version')",
            &[],
        )
        .await
        .map_err(|e| pg_error("version check", e))?;
    let (num, name): (i32, String) = (cell(&row, 0)?, cell(&row, 1)?);
    if num < MIN_SERVER {
        return Err(Error::unsupported(format_args!(
            "PostgreSQL {name} is too old: distlock needs 12 or newer"
        )));
    }
    if let Some(version) = installed(client).await? {
        return check(version);
    }
    if !create {
        return Err(Error::new(
            ErrorKind::Backend,
            "postgres: the distlock schema is not installed (apply `PgBackend::schema_sql()`, or let the backend create it)",
        ));
    }
    install(client).await?;
    match installed(client).await? {
        Some(version) => check(version),
        None => Err(Error::new(
            ErrorKind::Backend,
            "postgres: the distlock schema was installed but cannot be seen",
        )),
    }
}

/// Whether `distlock.meta` exists, read from the catalog tables with the statement's own
/// snapshot (name lookups inside a transaction may still see a cached "no such schema" from
/// before another session created it).
const PRESENT: &str = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'distlock' AND c.relname = 'meta')";

/// The installed schema's version, or `None` if there is none. Outside a transaction.
async fn installed(client: &Client) -> Result<Option<i32>> {
    let row = client
        .query_typed_one(PRESENT, &[])
        .await
        .map_err(|e| pg_error("schema check", e))?;
    if !cell::<bool>(&row, 0)? {
        return Ok(None);
    }
    let row = client
        .query_typed_one("SELECT max(version) FROM distlock.meta", &[])
        .await
        .map_err(|e| pg_error("schema check", e))?;
    cell::<Option<i32>>(&row, 0)
}

/// Column `i` of a row, or a clear error if the server sent something else.
fn cell<'r, T: tokio_postgres::types::FromSql<'r>>(
    row: &'r tokio_postgres::Row,
    i: usize,
) -> Result<T> {
    row.try_get(i).map_err(|e| {
        Error::new(
            ErrorKind::Backend,
            "postgres: unexpected reply to a schema check",
        )
        .with_source(e)
    })
}

fn check(version: i32) -> Result<()> {
    match version {
        VERSION => Ok(()),
        v if v > VERSION => Err(Error::unsupported(format_args!(
            "the distlock schema on the server is version {v}, newer than this build's {VERSION}: upgrade distlock"
        ))),
        v => Err(Error::unsupported(format_args!(
            "the distlock schema on the server is version {v}, older than this build's {VERSION}: \
             once no lock is held or waited for, drop it (`DROP SCHEMA distlock CASCADE`) and \
             the backend creates the new one (fencing tokens keep increasing: they never fall \
             below the server's time in microseconds)"
        ))),
    }
}

/// Creates the schema in one transaction, under an advisory lock so that concurrent first uses
/// install it once (the caller then reads its version in a transaction of its own).
async fn install(client: &Client) -> Result<()> {
    let fail = |e| pg_error("schema install", e);
    client.batch_execute("BEGIN").await.map_err(fail)?;
    let done = async {
        client
            .query_typed(
                "SELECT pg_advisory_xact_lock($1)",
                &[(&INSTALL_LOCK, tokio_postgres::types::Type::INT8)],
            )
            .await
            .map_err(fail)?;
        let present = client.query_typed_one(PRESENT, &[]).await.map_err(fail)?;
        if cell::<bool>(&present, 0)? {
            return Ok(());
        }
        client.batch_execute(SQL).await.map_err(fail)
    }
    .await;
    let end = if done.is_ok() { "COMMIT" } else { "ROLLBACK" };
    client.batch_execute(end).await.map_err(fail)?;
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_builds_schema_version_is_accepted() {
        assert!(check(VERSION).is_ok());
        let newer = check(VERSION + 1).unwrap_err();
        assert!(newer.is_unsupported());
        assert!(newer.to_string().contains("upgrade distlock"), "{newer}");
        let older = check(VERSION - 1).unwrap_err();
        assert!(older.is_unsupported());
        assert!(
            older.to_string().contains("DROP SCHEMA distlock CASCADE"),
            "{older}"
        );
    }

    #[test]
    fn the_sql_records_its_version() {
        assert!(SQL.contains(&format!(
            "INSERT INTO distlock.meta (version) VALUES ({VERSION});"
        )));
    }
}
