//! Runtime settings for `sekali serve`. Secrets come only from the environment and are never
//! printed: [`SecretString`] redacts itself in `Debug`.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

use crate::providers::{Providers, REGISTRY};
/// SQLite: how long a statement waits for another process's lock before failing with
/// `SQLITE_BUSY` (answered as 503, which every provider retries).
pub use crate::store::sqlite::DEFAULT_BUSY_TIMEOUT;

pub const ENV_API_TOKENS: &str = "SEKALI_API_TOKENS";
/// The operator console's login tokens (`name:token`, the name recorded as the operator's);
/// unset means the console takes the orders API's tokens, and with neither it is off.
pub const ENV_CONSOLE_TOKENS: &str = "SEKALI_CONSOLE_TOKENS";

/// Idempotency keys of sekali's own API are kept a day, as Stripe keeps them.
pub const DEFAULT_IDEMPOTENCY_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// 1 MiB: a Stripe event is a few kilobytes; anything near this is not a webhook.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;
pub const DEFAULT_PURGE_INTERVAL: Duration = Duration::from_secs(3600);
/// A webhook is a few kilobytes, sent at once; 10 s is generous for a slow link and short enough
/// that a connection holding a body back is soon given up.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_BATCH_MAX: usize = 256;
pub const DEFAULT_QUEUE_CAPACITY: usize = 4096;

/// One `name:token` pair from `SEKALI_API_TOKENS`. The name identifies the calling service (keys
/// are scoped to it); the token is compared in constant time and never printed.
#[derive(Debug, Clone)]
pub struct ApiToken {
    pub name: String,
    pub token: SecretString,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{variable} must be comma-separated name:token pairs with non-empty names and tokens; entry {entry} is not")]
    BadToken {
        variable: &'static str,
        entry: usize,
    },
    #[error("{variable}: entries {first} and {second} have the same token, so a caller could not be told apart (the API scopes Idempotency-Keys to its name, the console records it as the operator); give each their own")]
    SharedToken {
        variable: &'static str,
        first: usize,
        second: usize,
    },
    #[error(
        "refusing to start: no provider is configured. Set {}",
        secret_variables()
    )]
    NoProviderConfigured,
    #[error("{0}")]
    Provider(String),
}

/// The variable that configures each provider, for the refusal to start without one.
fn secret_variables() -> String {
    REGISTRY
        .iter()
        .filter_map(|r| {
            r.environment
                .first()
                .map(|(name, what)| format!("{name} ({what})"))
        })
        .collect::<Vec<_>>()
        .join(", or ")
}

/// Reads `SEKALI_API_TOKENS` (comma-separated `name:token`); unset means the orders API is off.
pub fn api_tokens_from_env() -> Result<Vec<ApiToken>, ConfigError> {
    parse_tokens(
        ENV_API_TOKENS,
        std::env::var(ENV_API_TOKENS).ok().as_deref().unwrap_or(""),
    )
}

/// Reads `SEKALI_CONSOLE_TOKENS`; unset or blank means the console logs in with `api_tokens`.
pub fn console_tokens_from_env(api_tokens: &[ApiToken]) -> Result<Vec<ApiToken>, ConfigError> {
    let tokens = parse_tokens(
        ENV_CONSOLE_TOKENS,
        std::env::var(ENV_CONSOLE_TOKENS)
            .ok()
            .as_deref()
            .unwrap_or(""),
    )?;
    Ok(if tokens.is_empty() {
        api_tokens.to_vec()
    } else {
        tokens
    })
}

/// The token of `tokens` that `presented` is, compared in constant time with every one of them
/// whatever matches first.
pub fn matching_token<'a>(tokens: &'a [ApiToken], presented: &str) -> Option<&'a ApiToken> {
    use subtle::ConstantTimeEq;
    let mut matched = None;
    for token in tokens {
        if bool::from(
            token
                .token
                .expose_secret()
                .as_bytes()
                .ct_eq(presented.as_bytes()),
        ) {
            matched = Some(token);
        }
    }
    matched
}

/// Parses the orders API's `name:token,name:token` (see [`parse_tokens`]).
pub fn parse_api_tokens(text: &str) -> Result<Vec<ApiToken>, ConfigError> {
    parse_tokens(ENV_API_TOKENS, text)
}

/// Parses `name:token,name:token` from `variable`; blank input means no tokens (the orders API
/// or the console is off). One name may have several tokens (rotation); one token may not serve
/// two names.
pub fn parse_tokens(variable: &'static str, text: &str) -> Result<Vec<ApiToken>, ConfigError> {
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
            _ => Err(ConfigError::BadToken {
                variable,
                entry: i + 1,
            }),
        })
        .collect::<Result<_, _>>()?;
    for (second, later) in tokens.iter().enumerate() {
        if let Some(first) = tokens[..second]
            .iter()
            .position(|t| t.token.expose_secret() == later.token.expose_secret())
        {
            return Err(ConfigError::SharedToken {
                variable,
                first: first + 1,
                second: second + 1,
            });
        }
    }
    Ok(tokens)
}

/// Everything `sekali serve` needs.
#[derive(Clone)]
pub struct Settings {
    pub listen: String,
    pub db: crate::store::Location,
    /// The configured providers; a provider not among them answers 404.
    pub providers: Providers,
    /// Bearer tokens for the orders API, each with the name of the calling service; empty means
    /// the orders API is off (404).
    pub api_tokens: Vec<ApiToken>,
    /// Login tokens of the operator console at `/console`; empty means it is off (404).
    pub console_tokens: Vec<ApiToken>,
    pub max_body_bytes: usize,
    pub purge_interval: Duration,
    pub purge_batch: usize,
    pub batch_max: usize,
    pub queue_capacity: usize,
    /// PostgreSQL: the instance's writer threads (`--pg-writers`).
    pub pg_writers: usize,
    /// HTTP worker threads; 0 means one per core.
    pub workers: usize,
    pub busy_timeout: Duration,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_timeout: Duration,
    /// A client must send its request head within this time, else 408 (slow-header defence).
    pub client_request_timeout: Duration,
    /// A request's body must arrive within this time once its head has, else 408 and the
    /// connection is closed (a body that stalls, or trickles in).
    pub body_timeout: Duration,
    /// How long an Idempotency-Key and its stored response are kept.
    pub idempotency_retention: Duration,
    /// Cap on the database size in pages (see [`crate::store::sqlite::WriterConfig::max_page_count`]).
    pub max_page_count: Option<u64>,
    /// The outbox relay to run beside the server (`None`: `--no-relay`).
    pub relay: Option<(
        crate::jobs::relay::RelayConfig,
        crate::mail::transport::MailConfig,
    )>,
    /// Where `/metrics` is served instead of `listen` (`None`: on `listen`).
    pub metrics_listen: Option<String>,
    /// Forwarding of order changes to the shop's endpoint (`None`: off).
    pub forward: Option<crate::forward::ForwardConfig>,
    /// Whether this instance sends forwarded changes (off with `--no-relay`: the changes are
    /// still queued while `forward` is set, for another instance to send).
    pub forward_sends: bool,
    /// Install SIGTERM / ctrl-c handlers (off in tests, which stop the server themselves).
    pub handle_signals: bool,
}

impl Settings {
    /// Defaults for everything but the address, the database and the providers.
    pub fn new(
        listen: impl Into<String>,
        db: impl Into<crate::store::Location>,
        providers: Providers,
    ) -> Self {
        Settings {
            listen: listen.into(),
            db: db.into(),
            providers,
            api_tokens: Vec::new(),
            console_tokens: Vec::new(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            purge_interval: DEFAULT_PURGE_INTERVAL,
            purge_batch: crate::store::DEFAULT_PURGE_BATCH,
            batch_max: DEFAULT_BATCH_MAX,
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            pg_writers: crate::store::DEFAULT_PG_WRITERS,
            workers: 0,
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
            shutdown_timeout: Duration::from_secs(30),
            client_request_timeout: Duration::from_secs(5),
            body_timeout: DEFAULT_BODY_TIMEOUT,
            idempotency_retention: DEFAULT_IDEMPOTENCY_RETENTION,
            max_page_count: None,
            relay: None,
            forward: None,
            forward_sends: true,
            metrics_listen: None,
            handle_signals: true,
        }
    }

    pub fn require_a_provider(&self) -> Result<(), ConfigError> {
        if self.providers.is_empty() {
            return Err(ConfigError::NoProviderConfigured);
        }
        Ok(())
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
            Err(ConfigError::SharedToken {
                variable: ENV_API_TOKENS,
                first: 1,
                second: 3
            })
        ));
        assert!(matches!(
            parse_api_tokens("shop:"),
            Err(ConfigError::BadToken {
                variable: ENV_API_TOKENS,
                entry: 1
            })
        ));
    }
}
