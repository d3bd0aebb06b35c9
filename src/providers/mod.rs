//! The payment providers: one module each, behind one trait, listed in one registry.
//!
//! A provider turns a delivery (its headers and raw body, at a given time) into a
//! [`NormalizedEvent`], or refuses it with a [`Rejection`] whose kind says which status its
//! sender gets. It also knows how its own deliveries are signed (for `sekali replay`, the load
//! generator and the tests), how long its event ids must be remembered, what its amounts' minor
//! units are, and how it is configured. Nothing here touches SQL or the HTTP server; a provider
//! that must ask its own API before it believes a delivery (Midtrans) does so through
//! `clients/`.
//!
//! Adding a provider: a module implementing [`Provider`], a [`Registration`] for it, and its
//! line in [`REGISTRY`]. The webhook route, the secrets, the retention, the refusal counters and
//! the startup warnings all come from here.

pub mod midtrans;
pub mod stripe;
pub mod xendit;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;

use crate::domain::{NormalizedEvent, ProviderName};

/// Every provider sekali knows, in the order they are listed.
pub const REGISTRY: &[Registration] = &[
    stripe::REGISTRATION,
    midtrans::REGISTRATION,
    xendit::REGISTRATION,
];

/// The headers of a delivery, by case-insensitive name.
pub trait Headers {
    fn get(&self, name: &str) -> Option<&[u8]>;
}

/// What a provider refuses a delivery for. The kind is the status its sender gets, decided here
/// once for every provider: [`RejectionKind::Malformed`] 400, [`RejectionKind::Unauthorized`] 401,
/// [`RejectionKind::NotConfirmed`] 503.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Rejection {
    pub kind: RejectionKind,
    /// Says what is wrong, for the sender; never a secret or a signature value.
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectionKind {
    /// Not a delivery the provider could have sent (a header or the body is malformed): 400.
    Malformed,
    /// Not proven to come from the provider (a signature or token that does not match, a stale
    /// timestamp): 401.
    Unauthorized,
    /// Could not be confirmed with the provider now (its API is unreachable, or does not report
    /// the status yet): 503, so that the provider sends it again.
    NotConfirmed,
}

impl Rejection {
    pub fn malformed(message: impl Into<String>) -> Self {
        Rejection {
            kind: RejectionKind::Malformed,
            message: message.into(),
        }
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Rejection {
            kind: RejectionKind::Unauthorized,
            message: message.into(),
        }
    }

    pub fn not_confirmed(message: impl Into<String>) -> Self {
        Rejection {
            kind: RejectionKind::NotConfirmed,
            message: message.into(),
        }
    }
}

impl From<PayloadError> for Rejection {
    fn from(error: PayloadError) -> Self {
        Rejection::malformed(error.to_string())
    }
}

/// A request ready to send, as the provider would send it: the body (a provider whose
/// signature is inside the body changes it) and the headers it sets.
pub struct SignedRequest {
    pub body: Vec<u8>,
    pub headers: Vec<(&'static str, String)>,
}

/// One configured provider.
pub trait Provider: Send + Sync {
    /// Its name: the route `/webhooks/{name}`, the `provider` column, the CLI's `--provider`.
    fn name(&self) -> &ProviderName;

    /// Verifies one delivery (its headers and raw body, at `now_unix`) and reads it into its
    /// normalised form (its `retention` is the webhook route's to set, from [`Provider::retention`],
    /// for every provider alike). A provider that confirms deliveries
    /// with its own API does so here, hence the future (it runs on the HTTP worker).
    fn verify<'a>(
        &'a self,
        headers: &'a dyn Headers,
        body: &'a [u8],
        now_unix: i64,
    ) -> LocalBoxFuture<'a, Result<NormalizedEvent, Rejection>>;

    /// How long its event ids are remembered.
    fn retention(&self) -> Duration;

    /// How long after an event the provider may still send it again (its retries, and resends
    /// by hand): a retention shorter than this is warned of at startup.
    fn redelivery_window(&self) -> Duration;

    /// `body` as the provider would send it at `now_unix`, with its signature.
    fn sign(&self, body: &[u8], now_unix: i64) -> Result<SignedRequest, String>;

    /// An unsigned event that pays `order_id` (2,500 minor units, or the currency's
    /// equivalent), with ids ending in `n`, for the load generator: the shape of a real one.
    fn sample_payment(&self, order_id: &str, n: &str) -> Vec<u8>;

    /// What an operator should know at startup about its settings (a secret that looks like
    /// the wrong kind of key); never a secret itself.
    fn startup_warnings(&self) -> Vec<String> {
        Vec::new()
    }

    /// Adds the metrics of what it calls itself (Midtrans's status API) to `/metrics`.
    fn register_metrics(&self, _registry: &mut prometheus_client::registry::Registry) {}

    /// The health of what it calls itself, for `/healthz` (Midtrans's status API, when the
    /// status check is on): a JSON object with a `status`. `None` when it calls nothing.
    fn dependency_health(&self) -> Option<(&'static str, serde_json::Value)> {
        None
    }

    /// What `sekali replay` tells its user after a delivery was answered 503 "not confirmed"
    /// ([`RejectionKind::NotConfirmed`]): why a test server says so, and what to do about it.
    /// `None` for a provider that never confirms a delivery with its own API.
    fn not_confirmed_hint(&self) -> Option<&'static str> {
        None
    }

    /// Settings worth a word in the listening line (`status check on`).
    fn describe(&self) -> String {
        String::new()
    }

    /// Connections a delivery opens to the provider's own API while it is verified (Midtrans's
    /// status check: one): files it holds open beside its own connection, which the server's
    /// connection limit counts.
    fn outbound_connections_per_delivery(&self) -> u64 {
        0
    }
}

/// Where a provider's settings come from: the environment, and the command line's generic
/// `--retention NAME=DURATION` and provider options (`--stripe-tolerance` is the option
/// `stripe.tolerance`).
pub struct ProviderSettings<'a> {
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// `(provider, option)` to its text.
    pub options: &'a std::collections::BTreeMap<(String, String), String>,
}

impl ProviderSettings<'_> {
    /// An environment variable, `None` when unset or blank.
    pub fn env(&self, name: &str) -> Option<String> {
        (self.env)(name).filter(|v| !v.trim().is_empty())
    }

    pub fn option(&self, provider: &str, option: &str) -> Option<&str> {
        self.options
            .get(&(provider.to_owned(), option.to_owned()))
            .map(String::as_str)
    }

    /// The provider's `retention` option, else `default`.
    pub fn retention(&self, provider: &str, default: Duration) -> Result<Duration, String> {
        match self.option(provider, "retention") {
            None => Ok(default),
            Some(text) => match humantime::parse_duration(text) {
                Ok(d) if !d.is_zero() => Ok(d),
                Ok(_) => Err(format!("the {provider} retention must be longer than zero")),
                Err(e) => Err(format!("the {provider} retention `{text}`: {e}")),
            },
        }
    }
}

/// Configures a provider from its settings (see [`Registration::configure`]).
pub type Configure = fn(&ProviderSettings<'_>) -> Result<Option<Arc<dyn Provider>>, String>;

/// Reads a body the provider verified before, with the event type it was applied as (see
/// [`Registration::read_stored`]).
pub type ReadStored = fn(&str, &[u8]) -> Result<NormalizedEvent, PayloadError>;

/// A provider sekali knows, before it is configured.
pub struct Registration {
    pub name: &'static str,
    /// The provider, configured from `settings`; `None` when its secret is not set (its route
    /// then answers 404), an error when a setting cannot work.
    pub configure: Configure,
    /// The environment variables it reads, each with what it is, for `serve --help`.
    pub environment: &'static [(&'static str, &'static str)],
    /// The provider options it takes (`--provider-option NAME.OPTION=VALUE`), each with what it
    /// is; `retention` is every provider's.
    pub options: &'static [(&'static str, &'static str)],
    /// Decimals of its amounts in `currency` (its own table, or ISO 4217's
    /// [`iso_exponent`](crate::domain::money::iso_exponent)).
    pub amount_exponent: fn(&str) -> u32,
    /// Reads a body it verified before (stored in `processed_events.payload`), with the event
    /// type it was applied as: the ledger is built from them when a database older than it is
    /// upgraded.
    pub read_stored: ReadStored,
}

/// The configured providers, by name.
#[derive(Clone, Default)]
pub struct Providers(Vec<Arc<dyn Provider>>);

impl Providers {
    /// Every registered provider whose secret is set.
    pub fn configure(settings: &ProviderSettings<'_>) -> Result<Providers, String> {
        for ((provider, option), _) in settings.options.iter() {
            let registration = REGISTRY
                .iter()
                .find(|r| r.name == provider)
                .ok_or_else(|| {
                    format!("no provider is called `{provider}` (known: {})", known())
                })?;
            if option != "retention" && !registration.options.iter().any(|(o, _)| o == option) {
                return Err(format!("{provider} has no option `{option}`"));
            }
        }
        let mut providers = Vec::new();
        for registration in REGISTRY {
            if let Some(provider) = (registration.configure)(settings)? {
                providers.push(provider);
            }
        }
        Ok(Providers(providers))
    }

    pub fn from_list(providers: Vec<Arc<dyn Provider>>) -> Self {
        Providers(providers)
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Provider>> {
        self.0.iter().find(|p| p.name().as_str() == name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn Provider>> {
        self.0.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The names of every registered provider, for messages.
pub fn known() -> String {
    REGISTRY
        .iter()
        .map(|r| r.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `name` is a registered provider.
pub fn is_registered(name: &str) -> bool {
    registration(name).is_some()
}

pub fn registration(name: &str) -> Option<&'static Registration> {
    REGISTRY.iter().find(|r| r.name == name)
}

/// Decimals of `provider`'s amounts in `currency` (ISO 4217's for a name not registered, such
/// as `operator`).
pub fn amount_exponent(provider: &str, currency: &str) -> u32 {
    registration(provider).map_or_else(
        || crate::domain::money::iso_exponent(currency),
        |r| (r.amount_exponent)(currency),
    )
}

/// Reads a body that `provider` verified before, applied as `event_type` (the ledger's rebuild
/// of an older database).
pub fn read_stored(
    provider: &str,
    event_type: &str,
    body: &[u8],
) -> Result<NormalizedEvent, String> {
    let read = registration(provider)
        .map(|r| r.read_stored)
        .ok_or_else(|| format!("no provider is called `{provider}`"))?;
    read(event_type, body).map_err(|e| e.to_string())
}

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
pub(crate) fn strip_position(err: &serde_json::Error) -> String {
    let text = err.to_string();
    match text.rfind(" at line ") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

/// A header as text, or a malformed-request rejection naming it.
pub(crate) fn header_text<'a>(
    headers: &'a dyn Headers,
    name: &str,
) -> Result<Option<&'a str>, Rejection> {
    headers
        .get(name)
        .map(|bytes| {
            std::str::from_utf8(bytes)
                .ok()
                .filter(|t| t.bytes().all(|b| (0x20..0x7f).contains(&b) || b == b'\t'))
                .ok_or_else(|| {
                    Rejection::malformed(format!("malformed {name} header: not visible ASCII"))
                })
        })
        .transpose()
}

/// Headers from a list (tests, and callers outside the HTTP server).
impl<const N: usize> Headers for [(&str, &str); N] {
    fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_bytes())
    }
}
