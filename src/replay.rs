//! `sekali replay`: sign fixture files the way the provider would and POST them, like
//! `stripe trigger` for local testing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use secrecy::ExposeSecret;

use crate::config::{Secrets, ENV_MIDTRANS_KEY, ENV_STRIPE_SECRET};
use crate::domain::Provider;
use crate::providers::{midtrans, stripe};

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("cannot tell the provider from {0}; pass --provider stripe|midtrans")]
    UnknownProvider(String),
    #[error("{0} is not set: replay signs with the same secret the server verifies with")]
    MissingSecret(&'static str),
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a Midtrans notification: {reason}")]
    NotANotification { path: String, reason: String },
}

/// The provider a webhook URL belongs to, from its path.
pub fn provider_from_url(url: &str) -> Option<Provider> {
    let path = url
        .split(['?', '#'])
        .next()
        .unwrap_or(url)
        .trim_end_matches('/');
    if path.ends_with("/webhooks/stripe") {
        Some(Provider::Stripe)
    } else if path.ends_with("/webhooks/midtrans") {
        Some(Provider::Midtrans)
    } else {
        None
    }
}

/// A request ready to send: body and the headers the provider would set.
pub struct SignedRequest {
    pub body: Vec<u8>,
    pub headers: Vec<(&'static str, String)>,
}

/// Signs `body` for `provider` at `now_unix`, as the provider would send it.
pub fn sign_for_provider(
    provider: Provider,
    body: &[u8],
    secrets: &Secrets,
    now_unix: i64,
) -> Result<SignedRequest, ReplayError> {
    match provider {
        Provider::Stripe => {
            let secret = secrets
                .stripe
                .first()
                .ok_or(ReplayError::MissingSecret(ENV_STRIPE_SECRET))?;
            let header = stripe::signature_header(&[secret.expose_secret()], now_unix, body);
            Ok(SignedRequest {
                body: body.to_vec(),
                headers: vec![
                    ("Stripe-Signature", header),
                    (
                        "User-Agent",
                        "Stripe/1.0 (+https://stripe.com/docs/webhooks)".into(),
                    ),
                ],
            })
        }
        Provider::Midtrans => {
            let key = secrets
                .midtrans
                .as_ref()
                .ok_or(ReplayError::MissingSecret(ENV_MIDTRANS_KEY))?;
            let body =
                midtrans::with_signature_key(body, key.expose_secret()).map_err(|reason| {
                    ReplayError::NotANotification {
                        path: String::new(),
                        reason,
                    }
                })?;
            Ok(SignedRequest {
                body,
                headers: vec![("User-Agent", "Veritrans".into())],
            })
        }
    }
}

/// POSTs each file; prints `FILE: STATUS BODY` per file. Returns true when every answer was 2xx.
pub async fn replay_files(
    url: &str,
    provider: Option<Provider>,
    files: &[PathBuf],
    secrets: &Secrets,
    now_unix: i64,
) -> Result<bool, ReplayError> {
    let provider = provider
        .or_else(|| provider_from_url(url))
        .ok_or_else(|| ReplayError::UnknownProvider(url.to_owned()))?;
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(30))
        .finish();
    let mut all_ok = true;
    for path in files {
        let raw = read(path)?;
        let signed = sign_for_provider(provider, &raw, secrets, now_unix).map_err(|e| match e {
            ReplayError::NotANotification { reason, .. } => ReplayError::NotANotification {
                path: path.display().to_string(),
                reason,
            },
            other => other,
        })?;
        let mut request = client
            .post(url)
            .insert_header(("Content-Type", "application/json"));
        for (name, value) in &signed.headers {
            request = request.insert_header((*name, value.as_str()));
        }
        match request.send_body(signed.body).await {
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
            }
            Err(e) => {
                crate::outln!("{}: request failed: {e}", path.display());
                all_ok = false;
            }
        }
    }
    Ok(all_ok)
}

fn read(path: &Path) -> Result<Vec<u8>, ReplayError> {
    std::fs::read(path).map_err(|source| ReplayError::Read {
        path: path.display().to_string(),
        source,
    })
}
