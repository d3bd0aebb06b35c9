//! Pure signature verification and event parsing, one module per provider.
//!
//! Nothing here touches HTTP or SQL: every function takes bytes and a time and returns a verdict,
//! which is what makes them easy to property-test and fuzz.

pub mod midtrans;
pub mod stripe;

use crate::domain::{NormalizedEvent, Provider};

/// The body was authentic but is not an event sekali can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// Not JSON at all (or not UTF-8).
    #[error("invalid JSON: {0}")]
    InvalidJson(String),
    /// JSON, but a required field is missing or has the wrong type.
    #[error("invalid event: {0}")]
    InvalidEvent(String),
}

impl PayloadError {
    pub(crate) fn from_serde(err: serde_json::Error) -> Self {
        use serde_json::error::Category;
        match err.classify() {
            Category::Data => PayloadError::InvalidEvent(strip_position(&err)),
            Category::Syntax | Category::Eof | Category::Io => {
                PayloadError::InvalidJson(strip_position(&err))
            }
        }
    }
}

/// serde_json appends " at line L column C"; the position is noise for a webhook sender and the
/// message already names the field.
fn strip_position(err: &serde_json::Error) -> String {
    let text = err.to_string();
    match text.rfind(" at line ") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

/// Re-reads a stored payload (already verified when it arrived), e.g. to apply a parked event.
pub fn normalise_stored(
    provider: Provider,
    payload: &[u8],
) -> Result<NormalizedEvent, PayloadError> {
    match provider {
        Provider::Stripe => stripe::parse_event(payload),
        Provider::Midtrans => midtrans::parse_notification(payload).map(|n| n.normalise()),
    }
}
