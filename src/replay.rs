//! `sekali replay`: sign fixture files the way the provider would and POST them, like
//! `stripe trigger` for local testing, with fields overridden first when asked (`--set`, see
//! [`set`]).
//!
//! A first-time user's two traps are explained where they are met, on stderr after the line of
//! the file that met them (once a run each): a server that does not listen, and a provider's
//! 503 "not confirmed" from a server that could not confirm a fixture with the provider's API
//! (see [`Provider::not_confirmed_hint`]).

mod set;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use set::{SetError, SetField, SetSyntaxError};

use crate::providers::{self, Provider, Providers};

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("cannot tell the provider from {0}; pass --provider ({known})", known = providers::known())]
    UnknownProvider(String),
    #[error("{provider} is not configured: replay signs with the same secret the server verifies with, so set {variable}")]
    NotConfigured { provider: String, variable: String },
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot set a field of {path}: {source}")]
    Set { path: String, source: SetError },
    #[error("cannot sign {path} as a {provider} delivery: {reason}")]
    Sign {
        path: String,
        provider: String,
        reason: String,
    },
}

/// The registered provider a webhook URL belongs to, from its path (`…/webhooks/{name}`).
pub fn provider_from_url(url: &str) -> Option<&'static str> {
    let path = url
        .split(['?', '#'])
        .next()
        .unwrap_or(url)
        .trim_end_matches('/');
    let (_, name) = path.rsplit_once("/webhooks/")?;
    providers::registration(name).map(|r| r.name)
}

/// The configured provider `name`, or the one of `url`.
pub fn choose_provider(
    configured: &Providers,
    name: Option<&str>,
    url: &str,
) -> Result<Arc<dyn Provider>, ReplayError> {
    let name = name
        .or_else(|| provider_from_url(url))
        .ok_or_else(|| ReplayError::UnknownProvider(url.to_owned()))?;
    configured.get(name).cloned().ok_or_else(|| {
        let variable = providers::registration(name)
            .and_then(|r| r.environment.first())
            .map_or_else(
                || "its secret".to_owned(),
                |(variable, _)| (*variable).to_owned(),
            );
        ReplayError::NotConfigured {
            provider: name.to_owned(),
            variable,
        }
    })
}

/// POSTs each file, with `sets` applied in order, signed at `now_unix`; prints `FILE: STATUS
/// BODY` per file, and a hint after a file whose answer has one. Every file is read, changed
/// and signed before the first is sent, so a `--set` that cannot be applied sends nothing.
/// Returns true when every answer was 2xx.
pub async fn replay_files(
    url: &str,
    provider: &dyn Provider,
    files: &[PathBuf],
    sets: &[SetField],
    now_unix: i64,
) -> Result<bool, ReplayError> {
    let mut signed = Vec::with_capacity(files.len());
    for path in files {
        let mut body = read(path)?;
        for field in sets {
            body = field.apply(&body).map_err(|source| ReplayError::Set {
                path: path.display().to_string(),
                source,
            })?;
        }
        let request = provider
            .sign(&body, now_unix)
            .map_err(|reason| ReplayError::Sign {
                path: path.display().to_string(),
                provider: provider.name().to_string(),
                reason,
            })?;
        signed.push((path, request));
    }
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(30))
        .finish();
    let mut all_ok = true;
    let mut hinted = Vec::new();
    for (path, signed) in signed {
        let mut request = client
            .post(url)
            .insert_header(("Content-Type", "application/json"));
        for (name, value) in &signed.headers {
            request = request.insert_header((*name, value.as_str()));
        }
        let hint = match request.send_body(signed.body).await {
            Ok(mut response) => {
                let status = response.status();
                let body = response.body().await.unwrap_or_default();
                crate::outln!(
                    "{}: {} {}",
                    path.display(),
                    status.as_u16(),
                    String::from_utf8_lossy(&body)
                );
                all_ok &= status.is_success();
                Hint::for_answer(provider, status.as_u16(), &body)
            }
            Err(e) => {
                crate::outln!("{}: request failed: {e}", path.display());
                all_ok = false;
                Hint::for_failure(&e)
            }
        };
        if let Some(hint) = hint.filter(|h| !hinted.contains(h)) {
            // After the file's line: stdout is line-buffered, so the line is out before this.
            eprintln!("hint: {}", hint.text(provider, url));
            hinted.push(hint);
        }
    }
    Ok(all_ok)
}

/// What a first-time user is told after a file whose answer needs explaining.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hint {
    /// Nothing listens at the URL: no server is running there.
    NotListening,
    /// 503 "not confirmed": the server could not confirm the delivery with the provider's API.
    NotConfirmed,
}

impl Hint {
    fn for_answer(provider: &dyn Provider, status: u16, body: &[u8]) -> Option<Hint> {
        let error = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned));
        (status == 503
            && error.as_deref() == Some(crate::routes::NOT_CONFIRMED)
            && provider.not_confirmed_hint().is_some())
        .then_some(Hint::NotConfirmed)
    }

    fn for_failure(error: &awc::error::SendRequestError) -> Option<Hint> {
        use awc::error::{ConnectError, SendRequestError};
        matches!(
            error,
            SendRequestError::Connect(ConnectError::Io(e))
                if e.kind() == std::io::ErrorKind::ConnectionRefused
        )
        .then_some(Hint::NotListening)
    }

    fn text(self, provider: &dyn Provider, url: &str) -> String {
        match self {
            Hint::NotListening => format!(
                "the connection to {url} was refused: no server listens there. Start one with \
                 `sekali serve` (with the same secret set as here), or check --url"
            ),
            Hint::NotConfirmed => provider
                .not_confirmed_hint()
                .expect("only a provider with a hint gives this one")
                .to_owned(),
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>, ReplayError> {
    std::fs::read(path).map_err(|source| ReplayError::Read {
        path: path.display().to_string(),
        source,
    })
}
