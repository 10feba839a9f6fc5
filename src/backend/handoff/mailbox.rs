//! One waiting claim's wake-ups: the strongest not yet read.

use std::sync::Mutex as StdMutex;

use tokio::sync::Notify;

use super::Wake;
use crate::sync::LockExt;

/// One waiting claim's wake-ups.
#[derive(Default)]
pub(crate) struct Mailbox {
    slot: StdMutex<Option<Wake>>,
    notify: Notify,
}

impl Mailbox {
    pub(crate) fn put(&self, wake: Wake) {
        let mut slot = self.slot.locked();
        // A grant is never overwritten, nor a re-check by a mere hint.
        let keep = matches!(
            (*slot, wake),
            (Some(Wake::Granted(_)), _) | (Some(Wake::Recheck), Wake::NextInLine(_))
        );
        if !keep {
            *slot = Some(wake);
        }
        drop(slot);
        self.notify.notify_one();
    }

    /// Waits for the next wake-up.
    pub(crate) async fn recv(&self) -> Wake {
        loop {
            let wake = self.slot.locked().take();
            if let Some(wake) = wake {
                return wake;
            }
            // `notify_one` stores a permit, so a wake-up between the check and here is kept.
            self.notify.notified().await;
        }
    }
}
