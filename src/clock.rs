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

/// Where a listing starts (`--since`): a moment, or how long before the command runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Since {
    /// That long before now.
    Ago(Duration),
    /// This moment, in Unix seconds.
    At(i64),
}

impl Since {
    /// The moment in Unix seconds, for a command run at `now_unix`.
    pub fn unix(self, now_unix: i64) -> i64 {
        match self {
            Since::Ago(ago) => {
                now_unix.saturating_sub(i64::try_from(ago.as_secs()).unwrap_or(i64::MAX))
            }
            Since::At(at) => at,
        }
    }
}

/// A duration (`1h`: an hour ago), or an RFC 3339 time: UTC (`Z`, as sekali stores and prints
/// times) or with an offset (`+07:00`), fractions of a second dropped (stored times have whole
/// seconds).
pub fn parse_since(text: &str) -> Option<Since> {
    if let Ok(ago) = humantime::parse_duration(text) {
        return Some(Since::Ago(ago));
    }
    rfc3339_unix(text).map(Since::At)
}

/// Unix seconds of an RFC 3339 time. humantime reads UTC only, so an offset (`+07:00`,
/// `-05:00`) is taken off first: the time is read as if it were UTC, then moved by it.
fn rfc3339_unix(text: &str) -> Option<i64> {
    let split = text
        .len()
        .checked_sub("+07:00".len())
        .filter(|at| text.is_char_boundary(*at));
    let (utc, offset_secs) = match split.map(|at| text.split_at(at)) {
        Some((time, offset)) if !time.ends_with('Z') => match offset.as_bytes() {
            [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2]
                if [h1, h2, m1, m2].iter().all(|d| d.is_ascii_digit()) =>
            {
                let digit = |d: &u8| i64::from(d - b'0');
                let (hours, minutes) = (digit(h1) * 10 + digit(h2), digit(m1) * 10 + digit(m2));
                if hours > 23 || minutes > 59 {
                    return None;
                }
                let secs = hours * 3600 + minutes * 60;
                (format!("{time}Z"), if *sign == b'+' { secs } else { -secs })
            }
            _ => (text.to_owned(), 0),
        },
        _ => (text.to_owned(), 0),
    };
    let at = humantime::parse_rfc3339(&utc).ok()?;
    let secs = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
    Some(i64::try_from(secs).ok()? - offset_secs)
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
