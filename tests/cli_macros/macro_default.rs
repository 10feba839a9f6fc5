//! `#[distributed_lock]` without `client = ...` uses the process default, and says clearly
//! when none was set. Its own test binary: the default is process-wide.
#![cfg(all(feature = "macros", feature = "memory"))]

use distlock::{distributed_lock, LockClient};

#[distributed_lock("reports:{day}")]
async fn report(day: u32) -> Result<u32, distlock::Error> {
    Ok(day)
}

#[tokio::test]
async fn the_default_client_is_used_and_its_absence_is_a_clear_error() {
    let err = report(1).await.unwrap_err();
    assert!(err.is_invalid_config(), "{err:?}");
    assert!(err.to_string().contains("set_default"), "{err}");

    let client = LockClient::memory();
    distlock::set_default(client.clone());
    assert_eq!(report(2).await.unwrap(), 2);
    let held = client.mutex("reports:3").lock().await.unwrap();
    let busy = tokio::time::timeout(std::time::Duration::from_millis(100), report(3)).await;
    assert!(busy.is_err(), "the default client's lock was not honoured");
    held.release().await.unwrap();
    assert_eq!(report(3).await.unwrap(), 3);
}
