//! Runtime settings for `sekali serve`. Secrets come only from the environment and are never
//! printed: [`SecretString`] redacts itself in `Debug`.

use std::path::PathBuf;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

use crate::providers::stripe::DEFAULT_TOLERANCE_SECS;
use crate::store::events::Retention;
use crate::store::DEFAULT_BUSY_TIMEOUT;

pub const ENV_STRIPE_SECRET: &str = "STRIPE_WEBHOOK_SECRET";
pub const ENV_MIDTRANS_KEY: &str = "MIDTRANS_SERVER_KEY";
pub const ENV_API_TOKENS: &str = "SEKALI_API_TOKENS";

/// Idempotency keys of sekali's own API are kept a day, as Stripe keeps them.
pub const DEFAULT_IDEMPOTENCY_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// 1 MiB: a Stripe event is a few kilobytes; anything near this is not a webhook.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;
/// Stripe retries for 3 days and the CLI resends events up to 30 days old.
pub const DEFAULT_STRIPE_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
/// Midtrans' five retries end within about 6 hours.
pub const DEFAULT_MIDTRANS_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
pub const DEFAULT_PURGE_INTERVAL: Duration = Duration::from_secs(3600);
pub const DEFAULT_BATCH_MAX: usize = 256;
pub const DEFAULT_QUEUE_CAPACITY: usize = 4096;

/// The configured provider secrets. An empty Stripe list or a missing Midtrans key means that
/// provider is not configured (its route answers 404).
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    /// Every listed secret is accepted (rotation).
    pub stripe: Vec<SecretString>,
    pub midtrans: Option<SecretString>,
    /// Bearer tokens for the orders API, each with the name of the calling service; empty means
    /// the orders API is off (404).
    pub api_tokens: Vec<ApiToken>,
}

/// One `name:token` pair from `SEKALI_API_TOKENS`. The name identifies the calling service (keys
/// are scoped to it); the token is compared in constant time and never printed.
#[derive(Debug, Clone)]
pub struct ApiToken {
    pub name: String,
    pub token: SecretString,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{ENV_API_TOKENS} must be comma-separated name:token pairs with non-empty names and tokens; entry {0} is not")]
    BadApiToken(usize),
    #[error("{ENV_API_TOKENS}: entries {first} and {second} have the same token, so a caller could not be told apart (its Idempotency-Keys are scoped to its name); give each service its own")]
    SharedApiToken { first: usize, second: usize },
    #[error(
        "refusing to start: no provider is configured. Set {ENV_STRIPE_SECRET} (comma-separated \
         whsec_... secrets) and/or {ENV_MIDTRANS_KEY} (the Midtrans server key)"
    )]
    NoProviderConfigured,
}

impl Secrets {
    /// Reads `STRIPE_WEBHOOK_SECRET` (comma-separated), `MIDTRANS_SERVER_KEY` and
    /// `SEKALI_API_TOKENS` (comma-separated `name:token`).
    pub fn from_env() -> Result<Self, ConfigError> {
        let mut secrets = Self::from_values(
            std::env::var(ENV_STRIPE_SECRET).ok().as_deref(),
            std::env::var(ENV_MIDTRANS_KEY).ok().as_deref(),
        );
        secrets.api_tokens =
            parse_api_tokens(std::env::var(ENV_API_TOKENS).ok().as_deref().unwrap_or(""))?;
        Ok(secrets)
    }

    pub fn from_values(stripe: Option<&str>, midtrans: Option<&str>) -> Self {
        let stripe = stripe
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| SecretString::from(s.to_owned()))
            .collect();
        let midtrans = midtrans
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| SecretString::from(s.to_owned()));
        Secrets {
            stripe,
            midtrans,
            api_tokens: Vec::new(),
        }
    }

    pub fn require_any(&self) -> Result<(), ConfigError> {
        if self.stripe.is_empty() && self.midtrans.is_none() {
            return Err(ConfigError::NoProviderConfigured);
        }
        Ok(())
    }
}

/// Parses `name:token,name:token`; blank input means no tokens (the orders API is off). One
/// name may have several tokens (rotation); one token may not serve two names.
pub fn parse_api_tokens(text: &str) -> Result<Vec<ApiToken>, ConfigError> {
    let tokens: Vec<ApiToken> = text
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .enumerate()
        .map(|(i, entry)| match entry.split_once(':') {
            Some((name, token)) if !name.trim().is_empty() && !token.trim().is_empty() => {
                Ok(ApiToken {
                    name: name.trim().to_owned(),
                    token: SecretString::from(token.trim().to_owned()),
                })
            }
            _ => Err(ConfigError::BadApiToken(i + 1)),
        })
        .collect::<Result<_, _>>()?;
    for (second, later) in tokens.iter().enumerate() {
        if let Some(first) = tokens[..second]
            .iter()
            .position(|t| t.token.expose_secret() == later.token.expose_secret())
        {
            return Err(ConfigError::SharedApiToken {
                first: first + 1,
                second: second + 1,
            });
        }
    }
    Ok(tokens)
}

/// Everything `sekali serve` needs.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: String,
    pub db_path: PathBuf,
    pub secrets: Secrets,
    pub stripe_tolerance_secs: u64,
    pub max_body_bytes: usize,
    pub stripe_retention: Duration,
    pub midtrans_retention: Duration,
    pub purge_interval: Duration,
    pub purge_batch: usize,
    pub batch_max: usize,
    pub queue_capacity: usize,
    /// HTTP worker threads; 0 means one per core.
    pub workers: usize,
    pub busy_timeout: Duration,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_timeout: Duration,
    /// A client must send its request head within this time, else 408 (slow-header defence).
    pub client_request_timeout: Duration,
    /// How long an Idempotency-Key and its stored response are kept.
    pub idempotency_retention: Duration,
    /// Cap on the database size in pages (see [`crate::store::WriterConfig::max_page_count`]).
    pub max_page_count: Option<u64>,
    /// The outbox relay to run beside the server (`None`: `--no-relay`). Its `db_path` is
    /// replaced by the server's.
    pub relay: Option<(
        crate::jobs::relay::RelayConfig,
        crate::mail::transport::MailConfig,
    )>,
    /// Install SIGTERM / ctrl-c handlers (off in tests, which stop the server themselves).
    pub handle_signals: bool,
    /// Midtrans's status API, asked to confirm every Midtrans notification before it is applied
    /// (`None`: notifications are applied as sent, `--midtrans-status-check off`). On by default
    /// whenever a Midtrans server key is set.
    pub midtrans_status: Option<crate::clients::midtrans_status::StatusApi>,
}

impl Settings {
    /// Defaults for everything but the address, the database and the secrets.
    pub fn new(listen: impl Into<String>, db_path: impl Into<PathBuf>, secrets: Secrets) -> Self {
        Settings {
            listen: listen.into(),
            db_path: db_path.into(),
            secrets: secrets.clone(),
            stripe_tolerance_secs: DEFAULT_TOLERANCE_SECS,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            stripe_retention: DEFAULT_STRIPE_RETENTION,
            midtrans_retention: DEFAULT_MIDTRANS_RETENTION,
            purge_interval: DEFAULT_PURGE_INTERVAL,
            purge_batch: crate::store::purge::DEFAULT_PURGE_BATCH,
            batch_max: DEFAULT_BATCH_MAX,
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            workers: 0,
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            shutdown_timeout: Duration::from_secs(30),
            client_request_timeout: Duration::from_secs(5),
            idempotency_retention: DEFAULT_IDEMPOTENCY_RETENTION,
            max_page_count: None,
            relay: None,
            handle_signals: true,
            midtrans_status: secrets.midtrans.as_ref().map(|key| {
                use crate::clients::midtrans_status::{StatusApi, TIMEOUT};
                StatusApi {
                    base_url: StatusApi::default_url_for(key).to_owned(),
                    server_key: key.clone(),
                    timeout: TIMEOUT,
                }
            }),
        }
    }

    pub fn retention(&self) -> Retention {
        Retention {
            stripe_secs: self.stripe_retention.as_secs() as i64,
            midtrans_secs: self.midtrans_retention.as_secs() as i64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_name_may_have_several_tokens_but_one_token_not_several_names() {
        let rotating = parse_api_tokens("shop:old-token, shop:new-token,").unwrap();
        assert_eq!(rotating.len(), 2);
        assert!(matches!(
            parse_api_tokens("shop:tok,billing:other,audit:tok"),
            Err(ConfigError::SharedApiToken {
                first: 1,
                second: 3
            })
        ));
        assert!(matches!(
            parse_api_tokens("shop:"),
            Err(ConfigError::BadApiToken(1))
        ));
    }
}
