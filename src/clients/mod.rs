//! Outbound HTTP to other services: what sekali asks of them, and how their failures are named.
//! Nothing here decides what an answer means for an order; the callers do.

pub mod midtrans_status;

use std::time::Duration;

/// What a service's answer other than 2xx said: its status, the delay it asked for
/// (`Retry-After` in seconds), and the start of its body (at most 200 characters of the first
/// 4 KiB), for a row's `last_error`.
pub struct Refusal {
    pub status: u16,
    pub retry_after: Option<Duration>,
    pub text: String,
}

/// Reads the [`Refusal`] of `response`.
pub async fn refusal<S>(response: &mut awc::ClientResponse<S>) -> Refusal
where
    S: futures_util::Stream<Item = Result<bytes::Bytes, awc::error::PayloadError>> + Unpin,
{
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let text = response
        .body()
        .limit(4096)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    Refusal {
        status: response.status().as_u16(),
        retry_after,
        text: text.chars().take(200).collect(),
    }
}
