//! Forwarding: every order change pushed to the shop's backend (`SEKALI_FORWARD_URL`), signed
//! per Standard Webhooks, in order per order, at least once (docs/forwarding.md).
//!
//! The changes wait in `forward_outbox`, written in the change's own transaction; the relay
//! (`jobs::forward`) claims them under leases, as it does emails, and this module sends them: the
//! body is the change as `GET /changes` serves it, signed with every configured secret.

use std::time::Duration;

use base64::Engine as _;
use secrecy::{ExposeSecret, SecretString};
use standardwebhooks::Webhook;

use crate::domain::text::without_userinfo;
use crate::mail::transport::SendError;

/// The shop's endpoint.
pub const ENV_URL: &str = "SEKALI_FORWARD_URL";
/// The signing secrets, comma-separated.
pub const ENV_SECRET: &str = "SEKALI_FORWARD_SECRET";

/// The shortest and longest secret, in bytes, as Standard Webhooks recommends (24 to 64).
pub const SECRET_BYTES: std::ops::RangeInclusive<usize> = 24..=64;
/// The bytes of a secret `sekali forward new-secret` makes.
pub const NEW_SECRET_BYTES: usize = 32;
const PREFIX: &str = "whsec_";

/// Where and how changes are forwarded.
#[derive(Clone)]
pub struct ForwardConfig {
    /// The shop's endpoint, `http://` or `https://`.
    pub url: String,
    /// One signer per configured secret: each message carries a signature of each (rotation).
    signers: Vec<Signer>,
}

#[derive(Clone)]
struct Signer(std::sync::Arc<Webhook>);

impl std::fmt::Debug for ForwardConfig {
    /// The URL without its password, and how many secrets: never a secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardConfig")
            .field("url", &self.shown_url())
            .field("secrets", &self.signers.len())
            .finish()
    }
}

/// A forwarding setting that cannot be used; names the variable, never a secret's value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ForwardConfigError {
    /// The URL as given, its password (if any) replaced by `***`.
    #[error("SEKALI_FORWARD_URL must be an http:// or https:// URL with a host, got {0:?}")]
    BadUrl(String),
    #[error("SEKALI_FORWARD_URL is set but SEKALI_FORWARD_SECRET is not: every forwarded message is signed; make one with `sekali forward new-secret`")]
    MissingSecret,
    #[error("SEKALI_FORWARD_SECRET is set but SEKALI_FORWARD_URL is not: set the shop's endpoint too, or unset the secret")]
    MissingUrl,
    #[error("SEKALI_FORWARD_SECRET: secret {position} of {count} {problem}; a secret is whsec_ and the base64 of 24 to 64 random bytes (`sekali forward new-secret` makes one)")]
    BadSecret {
        position: usize,
        count: usize,
        problem: &'static str,
    },
}

impl ForwardConfig {
    /// From the environment ([`ENV_URL`], [`ENV_SECRET`]): see [`ForwardConfig::from_values`].
    pub fn from_env() -> Result<Option<ForwardConfig>, ForwardConfigError> {
        let url = std::env::var(ENV_URL).ok();
        let secret = std::env::var(ENV_SECRET).ok().map(SecretString::from);
        Self::from_values(url.as_deref(), secret.as_ref())
    }

    /// From `SEKALI_FORWARD_URL` and `SEKALI_FORWARD_SECRET` (comma-separated secrets):
    /// `Ok(None)` when neither is set (forwarding off).
    pub fn from_values(
        url: Option<&str>,
        secrets: Option<&SecretString>,
    ) -> Result<Option<ForwardConfig>, ForwardConfigError> {
        let url = url.map(str::trim).filter(|u| !u.is_empty());
        let secrets = secrets
            .map(|s| s.expose_secret().trim())
            .filter(|s| !s.is_empty());
        let (url, secrets) = match (url, secrets) {
            (None, None) => return Ok(None),
            (Some(_), None) => return Err(ForwardConfigError::MissingSecret),
            (None, Some(_)) => return Err(ForwardConfigError::MissingUrl),
            (Some(url), Some(secrets)) => (url, secrets),
        };
        let parsed = url
            .parse::<awc::http::Uri>()
            .map_err(|_| ForwardConfigError::BadUrl(without_userinfo(url)))?;
        let scheme_ok = matches!(parsed.scheme_str(), Some("http" | "https"));
        if !scheme_ok || parsed.host().is_none_or(str::is_empty) {
            return Err(ForwardConfigError::BadUrl(without_userinfo(url)));
        }
        let parts: Vec<&str> = secrets.split(',').map(str::trim).collect();
        let count = parts.len();
        let signers = parts
            .iter()
            .enumerate()
            .map(|(i, secret)| {
                let bad = |problem| ForwardConfigError::BadSecret {
                    position: i + 1,
                    count,
                    problem,
                };
                let encoded = secret
                    .strip_prefix(PREFIX)
                    .ok_or_else(|| bad("does not start with whsec_"))?;
                let key = base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .map_err(|_| bad("is not base64 after whsec_"))?;
                if !SECRET_BYTES.contains(&key.len()) {
                    return Err(bad("is not 24 to 64 bytes long"));
                }
                Ok(Signer(std::sync::Arc::new(
                    Webhook::from_bytes(key).map_err(|_| bad("cannot be used"))?,
                )))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(ForwardConfig {
            url: url.to_owned(),
            signers,
        }))
    }

    /// The URL as logs show it: a `user:password@` in it becomes `***@`.
    pub fn shown_url(&self) -> String {
        without_userinfo(&self.url)
    }

    /// The `webhook-signature` header of `body` sent as message `id` at `timestamp`: `v1,<base64>`
    /// for each secret, space-separated.
    pub fn signature(&self, id: &str, timestamp: i64, body: &str) -> String {
        self.signers
            .iter()
            .map(|signer| {
                signer
                    .0
                    .sign(id, timestamp, body.as_bytes())
                    .expect("a UTF-8 body signs")
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// A fresh secret: `whsec_` and the base64 of 32 random bytes from the operating system.
pub fn new_secret() -> Result<String, getrandom::Error> {
    let mut key = [0u8; NEW_SECRET_BYTES];
    getrandom::fill(&mut key)?;
    Ok(format!(
        "{PREFIX}{}",
        base64::engine::general_purpose::STANDARD.encode(key)
    ))
}

/// One message for the shop's endpoint.
#[derive(Debug, Clone)]
pub struct Message {
    /// `webhook-id`: the change's id, the same on every attempt.
    pub id: String,
    /// The change, as JSON.
    pub body: String,
}

/// Sends messages to the shop's endpoint over one client (kept, so connections are reused).
pub struct Forwarder {
    config: ForwardConfig,
    client: awc::Client,
    timeout: Duration,
}

impl Forwarder {
    /// A connection not made within half of `timeout` is the endpoint's unavailability
    /// (counted against no message), found before the attempt's own timeout.
    pub fn new(config: ForwardConfig, timeout: Duration) -> Forwarder {
        let client = awc::Client::builder()
            .connector(awc::Connector::new().timeout(timeout / 2))
            .timeout(timeout)
            .disable_redirects()
            .finish();
        Forwarder {
            config,
            client,
            timeout,
        }
    }

    /// The endpoint for logs: without a user and password it may carry.
    pub fn url(&self) -> String {
        self.config.shown_url()
    }

    /// Sends every message at once; the results in the messages' order.
    pub async fn send_batch(
        &self,
        messages: &[Message],
        now_unix: i64,
    ) -> Vec<Result<(), SendError>> {
        futures_util::future::join_all(messages.iter().map(|m| self.send(m, now_unix))).await
    }

    /// One attempt. 2xx is done; 408, 409, 425, 429 and 5xx are worth another try (after the
    /// endpoint's `Retry-After`, when it gives one); any other answer is final for this message.
    /// An endpoint that cannot be reached is unavailable: no try of the message.
    pub async fn send(&self, message: &Message, now_unix: i64) -> Result<(), SendError> {
        let signature = self.config.signature(&message.id, now_unix, &message.body);
        let mut response = self
            .client
            .post(&self.config.url)
            .timeout(self.timeout)
            .insert_header(("content-type", "application/json"))
            .insert_header(("webhook-id", message.id.as_str()))
            .insert_header(("webhook-timestamp", now_unix.to_string()))
            .insert_header(("webhook-signature", signature))
            .insert_header(("user-agent", concat!("sekali/", env!("CARGO_PKG_VERSION"))))
            .send_body(message.body.clone())
            .await
            .map_err(|e| SendError::of_request(e, "the shop's endpoint"))?;
        if response.status().is_success() {
            return Ok(());
        }
        let crate::clients::Refusal {
            status,
            retry_after,
            text,
        } = crate::clients::refusal(&mut response).await;
        let reason = format!("the shop's endpoint answered {status}: {text}");
        match status {
            408 | 409 | 425 | 429 | 500..=599 => Err(SendError::Transient {
                reason,
                retry_after,
            }),
            _ => Err(SendError::Permanent(reason)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(text: &str) -> SecretString {
        SecretString::from(text.to_owned())
    }

    #[test]
    fn forwarding_is_off_without_either_setting_and_refused_with_one() {
        assert!(ForwardConfig::from_values(None, None).unwrap().is_none());
        assert_eq!(
            ForwardConfig::from_values(Some("https://shop.example/hooks"), None).unwrap_err(),
            ForwardConfigError::MissingSecret
        );
        let s = secret(&new_secret().unwrap());
        assert_eq!(
            ForwardConfig::from_values(None, Some(&s)).unwrap_err(),
            ForwardConfigError::MissingUrl
        );
    }

    #[test]
    fn a_bad_url_or_secret_is_refused_naming_which_and_never_the_secret() {
        let s = secret(&new_secret().unwrap());
        for url in [
            "ftp://shop.example/",
            "shop.example/hooks",
            "https://",
            "not a url",
        ] {
            assert!(
                matches!(
                    ForwardConfig::from_values(Some(url), Some(&s)),
                    Err(ForwardConfigError::BadUrl(_))
                ),
                "{url}"
            );
        }
        let short = format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode([7u8; 16])
        );
        let good = new_secret().unwrap();
        for (value, position, problem) in [
            (format!("{good},{short}"), 2, "is not 24 to 64 bytes long"),
            (
                "c2VjcmV0LXdpdGhvdXQtcHJlZml4LTEyMzQ1Njc4OQ==".to_owned(),
                1,
                "does not start with whsec_",
            ),
            ("whsec_!!!".to_owned(), 1, "is not base64 after whsec_"),
        ] {
            let error =
                ForwardConfig::from_values(Some("https://shop.example/h"), Some(&secret(&value)))
                    .unwrap_err();
            assert!(
                matches!(error, ForwardConfigError::BadSecret { position: p, problem: q, .. } if p == position && q == problem),
                "{error}"
            );
            assert!(!error.to_string().contains(&value), "{error}");
        }
    }

    #[test]
    fn each_secret_signs_the_message_and_the_official_verifier_accepts_each() {
        let (old, new) = (new_secret().unwrap(), new_secret().unwrap());
        let config = ForwardConfig::from_values(
            Some("https://shop.example/hooks"),
            Some(&secret(&format!("{old}, {new}"))),
        )
        .unwrap()
        .unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let body = r#"{"id":"chg_1","type":"order.paid"}"#;
        let signature = config.signature("chg_1", now, body);
        assert_eq!(signature.split(' ').count(), 2);
        assert!(signature.split(' ').all(|s| s.starts_with("v1,")));
        let mut headers = http::HeaderMap::new();
        headers.insert("webhook-id", "chg_1".parse().unwrap());
        headers.insert("webhook-timestamp", now.to_string().parse().unwrap());
        headers.insert("webhook-signature", signature.parse().unwrap());
        for known in [&old, &new] {
            Webhook::new(known)
                .unwrap()
                .verify(body.as_bytes(), &headers)
                .unwrap();
        }
        let stranger = new_secret().unwrap();
        assert!(Webhook::new(&stranger)
            .unwrap()
            .verify(body.as_bytes(), &headers)
            .is_err());
        // Another body under the same headers is refused.
        assert!(Webhook::new(&new)
            .unwrap()
            .verify(br#"{"id":"chg_1","type":"order.refunded"}"#, &headers)
            .is_err());
    }

    #[test]
    fn a_password_in_the_url_is_never_shown() {
        let s = secret(&new_secret().unwrap());
        let config = ForwardConfig::from_values(
            Some("https://shop:pa55@shop.example/hooks?a=b@c"),
            Some(&s),
        )
        .unwrap()
        .unwrap();
        assert_eq!(config.shown_url(), "https://***@shop.example/hooks?a=b@c");
        assert!(!format!("{config:?}").contains("pa55"));
    }

    #[test]
    fn new_secrets_are_32_random_bytes_and_differ() {
        let (a, b) = (new_secret().unwrap(), new_secret().unwrap());
        assert_ne!(a, b);
        let key = base64::engine::general_purpose::STANDARD
            .decode(a.strip_prefix("whsec_").unwrap())
            .unwrap();
        assert_eq!(key.len(), NEW_SECRET_BYTES);
    }
}
