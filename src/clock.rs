//! Injectable time, so tolerance, retention and purge are testable without sleeping.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of "now" in whole Unix seconds.
pub trait Clock: Send + Sync + 'static {
    fn now_unix(&self) -> i64;

    /// Now in Unix milliseconds (the relay's timing columns).
    fn now_millis(&self) -> i64 {
        self.now_unix() * 1000
    }
}

/// The shared clock handle every component holds.
pub type SharedClock = Arc<dyn Clock>;

/// The real wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_unix(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0)
    }

    fn now_millis(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to; for tests.
#[derive(Debug)]
pub struct ManualClock {
    now: AtomicI64,
}

impl ManualClock {
    pub fn new(now_unix: i64) -> Arc<Self> {
        Arc::new(Self {
            now: AtomicI64::new(now_unix),
        })
    }

    pub fn set(&self, now_unix: i64) {
        self.now.store(now_unix, Ordering::SeqCst);
    }

    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_secs() as i64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_unix(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// Formats Unix seconds as ISO-8601 UTC text, `YYYY-MM-DDTHH:MM:SSZ`: fixed width, so it sorts
/// as text, which is how every timestamp column in the database is stored.
pub fn iso_seconds(unix: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_secs(unix.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Formats Unix milliseconds as `YYYY-MM-DDTHH:MM:SS.mmmZ`: fixed width, sortable as text.
pub fn iso_millis(unix_millis: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(unix_millis.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_seconds_is_fixed_width_utc() {
        assert_eq!(iso_seconds(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso_seconds(1_732_870_000), "2024-11-29T08:46:40Z");
    }
}
