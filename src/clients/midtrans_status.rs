//! Midtrans's status API, which confirms a notification: `GET {base}/v2/{id}/status` with the
//! server key as Basic auth user, as Midtrans's own libraries ask it. `{id}` is a
//! `transaction_id` or an `order_id`; the API accepts either. What the answer means
//! is decided by `providers::midtrans::Notification::confirmed_by`.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

/// Production. [`SANDBOX_URL`] for a sandbox server key (`SB-…`).
pub const PRODUCTION_URL: &str = "https://api.midtrans.com";
pub const SANDBOX_URL: &str = "https://api.sandbox.midtrans.com";
pub const ENV_API_URL: &str = "MIDTRANS_API_URL";

/// How long one status request may take. Midtrans waits 15 s for the notification's answer and
/// asks for one within 5 s; a slower API is answered 503, and Midtrans retries.
pub const TIMEOUT: Duration = Duration::from_secs(4);

/// The largest status answer read; a real one is about a kilobyte.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Where the status API is, and the key to ask it with.
#[derive(Debug, Clone)]
pub struct StatusApi {
    pub base_url: String,
    pub server_key: SecretString,
    pub timeout: Duration,
    /// Its calls, counted for `/metrics`.
    pub metrics: StatusApiMetrics,
}

/// The status API's calls by result (`answered`, `failed`: a 5xx, `unreachable`) and their
/// latency, shared by every clone of a [`StatusApi`].
#[derive(Debug, Clone)]
pub struct StatusApiMetrics {
    calls: prometheus_client::metrics::family::Family<
        Vec<(&'static str, &'static str)>,
        prometheus_client::metrics::counter::Counter,
    >,
    latency: prometheus_client::metrics::histogram::Histogram,
    /// The last call's result and when it ended, for `/healthz`.
    last: std::sync::Arc<std::sync::Mutex<Option<(std::time::SystemTime, &'static str)>>>,
}

impl Default for StatusApiMetrics {
    fn default() -> Self {
        let calls = prometheus_client::metrics::family::Family::default();
        for result in ["answered", "failed", "unreachable"] {
            let _ = calls.get_or_create(&vec![("result", result)]);
        }
        StatusApiMetrics {
            calls,
            // 10 ms to about 10 s (the call's timeout is 4 s).
            latency: prometheus_client::metrics::histogram::Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.01, 2.0, 11),
            ),
            last: Default::default(),
        }
    }
}

impl StatusApiMetrics {
    fn count(&self, result: &'static str, took: Duration) {
        self.calls.get_or_create(&vec![("result", result)]).inc();
        self.latency.observe(took.as_secs_f64());
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((std::time::SystemTime::now(), result));
    }

    /// What `/healthz` says of the status API: `failing` while its last call failed (a 5xx or
    /// no answer: notifications are answered 503 until it answers again), else `ok`.
    pub fn health(&self) -> serde_json::Value {
        let last = *self.last.lock().unwrap_or_else(|e| e.into_inner());
        let count = |result| self.calls.get_or_create(&vec![("result", result)]).get();
        let (status, last_call) = match last {
            None => ("ok", serde_json::Value::Null),
            Some((at, result)) => (
                if result == "answered" {
                    "ok"
                } else {
                    "failing"
                },
                serde_json::json!({
                    "result": result,
                    "at": humantime::format_rfc3339_millis(at).to_string(),
                }),
            ),
        };
        serde_json::json!({
            "status": status,
            "last_call": last_call,
            "answered": count("answered"),
            "failed": count("failed"),
            "unreachable": count("unreachable"),
        })
    }

    /// Adds the calls' metrics to `registry`.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "midtrans_status_api_requests",
            "Calls to Midtrans's status API confirming notifications, by result (failed: a 5xx; unreachable: no answer)",
            self.calls.clone(),
        );
        registry.register_with_unit(
            "midtrans_status_api_duration",
            "How long each call to Midtrans's status API took",
            prometheus_client::registry::Unit::Seconds,
            self.latency.clone(),
        );
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StatusApiError {
    #[error("the status API at {base_url} could not be reached: {reason}")]
    Unreachable { base_url: String, reason: String },
    #[error("the status API answered HTTP {status}")]
    Failed { status: u16 },
}

impl StatusApi {
    /// The default base URL for `server_key`: the sandbox for a sandbox key (`SB-…`), else
    /// production.
    pub fn default_url_for(server_key: &SecretString) -> &'static str {
        if server_key.expose_secret().starts_with("SB-") {
            SANDBOX_URL
        } else {
            PRODUCTION_URL
        }
    }

    /// The status answer's body for `id`: a `transaction_id`, whose answer is that transaction's
    /// status, or an `order_id`, whose answer is the order's latest transaction. An HTTP error
    /// status with a body is passed on as an answer, because Midtrans puts its own code inside
    /// the body (`"status_code": "404"`) and not always in the HTTP status; a server error or no
    /// answer at all is [`StatusApiError`].
    pub async fn fetch(&self, id: &str) -> Result<Vec<u8>, StatusApiError> {
        let started = std::time::Instant::now();
        let answer = self.ask(id).await;
        let result = match &answer {
            Ok(_) => "answered",
            Err(StatusApiError::Failed { .. }) => "failed",
            Err(StatusApiError::Unreachable { .. }) => "unreachable",
        };
        self.metrics.count(result, started.elapsed());
        answer
    }

    async fn ask(&self, id: &str) -> Result<Vec<u8>, StatusApiError> {
        let url = format!(
            "{}/v2/{}/status",
            self.base_url.trim_end_matches('/'),
            crate::domain::text::path_segment(id)
        );
        let unreachable = |reason: String| StatusApiError::Unreachable {
            base_url: crate::domain::text::without_userinfo(&self.base_url),
            reason,
        };
        let mut response = client(self.timeout)
            .get(url)
            .basic_auth(self.server_key.expose_secret(), "")
            .insert_header(("Accept", "application/json"))
            .send()
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let status = response.status().as_u16();
        if status >= 500 {
            return Err(StatusApiError::Failed { status });
        }
        let body = response
            .body()
            .limit(MAX_ANSWER_BYTES)
            .await
            .map_err(|e| unreachable(format!("reading the answer: {e}")))?;
        Ok(body.to_vec())
    }
}

/// One client per HTTP worker thread, so its connections (and TLS sessions) are reused
/// (`awc::Client` cannot move between threads).
fn client(timeout: Duration) -> awc::Client {
    thread_local! {
        static CLIENT: std::cell::OnceCell<awc::Client> = const { std::cell::OnceCell::new() };
    }
    CLIENT.with(|cell| {
        cell.get_or_init(|| {
            // No redirects: the API answers where it is asked, and the server key it is asked
            // with goes nowhere else (a redirect's answer is no status, and is answered 503).
            awc::Client::builder()
                .connector(awc::Connector::new().timeout(timeout))
                .timeout(timeout)
                .max_redirects(0)
                .finish()
        })
        .clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_url_is_the_sandbox_for_an_sb_key_and_production_otherwise() {
        let url = |key: &str| StatusApi::default_url_for(&SecretString::from(key.to_owned()));
        assert_eq!(url("SB-Mid-server-abc"), "https://api.sandbox.midtrans.com");
        assert_eq!(url("Mid-server-abc"), "https://api.midtrans.com");
        assert_eq!(url("sb-Mid-server-abc"), "https://api.midtrans.com");
        assert_eq!(url(""), "https://api.midtrans.com");
    }
}
