//! Building blocks for sekali's own API: bearer authentication and the Idempotency-Key.
//!
//! A mutating route opts in to idempotency by taking [`ApiClient`] and [`IdempotencyKey`] as
//! extractors (in that order: 401 before 400), validating its body, and answering with one call
//! to [`idempotent`], giving it the order to create and how to word the response, both run
//! inside the store's transaction; see `orders::create_order`.

use std::collections::HashSet;
use std::future::{ready, Ready};
use std::sync::Mutex;

use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::{web, FromRequest, HttpRequest};

use super::problem::Problem;
use super::AppState;
use crate::store::{CreateOrder, IdempotentOutcome, NewOrder, Respond, StoredResponse};
use crate::telemetry::ErrorChain;

/// The calling service, named by the token it presented.
#[derive(Debug, Clone)]
pub struct ApiClient(pub String);

impl FromRequest for ApiClient {
    type Error = Problem;
    type Future = Ready<Result<Self, Problem>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(authenticate(req))
    }
}

fn authenticate(req: &HttpRequest) -> Result<ApiClient, Problem> {
    let state = req
        .app_data::<web::Data<AppState>>()
        .expect("AppState is registered");
    let tokens = &state.api_tokens;
    if tokens.is_empty() {
        return Err(Problem::api_disabled());
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .ok_or_else(Problem::unauthorized)?;
    crate::config::matching_token(tokens, presented)
        .map(|token| ApiClient(token.name.clone()))
        .ok_or_else(Problem::unauthorized)
}

/// The decoded Idempotency-Key: `"k-1"` (the draft's sf-string) and `k-1` are the same key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(pub String);

pub const MAX_IDEMPOTENCY_KEY_CHARS: usize = 255;

impl FromRequest for IdempotencyKey {
    type Error = Problem;
    type Future = Ready<Result<Self, Problem>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(match req.headers().get("Idempotency-Key") {
            None => Err(Problem::missing_idempotency_key()),
            Some(value) => value
                .to_str()
                .map_err(|_| "the Idempotency-Key must be printable ASCII".to_owned())
                .and_then(parse_idempotency_key)
                .map(IdempotencyKey)
                .map_err(|why| Problem::malformed_idempotency_key(&why)),
        })
    }
}

/// Decodes an Idempotency-Key header value: an RFC 8941 sf-string, or a bare key of printable
/// ASCII without spaces or quotes; 1-255 characters after decoding.
pub fn parse_idempotency_key(raw: &str) -> Result<String, String> {
    let raw = raw.trim();
    let key = if raw.starts_with('"') {
        match sfv::Parser::new(raw).parse_item::<sfv::Item>() {
            Ok(item) => match item.bare_item {
                sfv::BareItem::String(s) => s.as_str().to_owned(),
                _ => {
                    return Err(
                        "the quoted Idempotency-Key is not a structured-field string".into(),
                    )
                }
            },
            Err(_) => {
                return Err(
                    "the quoted Idempotency-Key is not a valid structured-field string".into(),
                )
            }
        }
    } else {
        if let Some(bad) = raw.chars().find(|c| !c.is_ascii_graphic() || *c == '"') {
            return Err(format!(
                "a bare Idempotency-Key is printable ASCII without spaces or quotes; found {bad:?} (quote the key to use other characters)"
            ));
        }
        raw.to_owned()
    };
    match key.chars().count() {
        0 => Err("the Idempotency-Key is empty".into()),
        n if n > MAX_IDEMPOTENCY_KEY_CHARS => Err(format!(
            "the Idempotency-Key has {n} characters; at most 255 are allowed"
        )),
        _ => Ok(key),
    }
}

/// Creates `order` under the request's Idempotency-Key and answers with the response to send and
/// whether it is a replay: the fresh response, the stored one (replayed), 422 for a key reused
/// with another request, 409 while the first request with the key is in flight, 503 if nothing
/// committed. `body` is the validated JSON body; the fingerprint covers the method, the path as
/// routed (percent-decoded as the router reads it: `/%6frders` is `/orders`) and its RFC 8785
/// form.
pub async fn idempotent(
    state: &web::Data<AppState>,
    client: ApiClient,
    key: IdempotencyKey,
    req: &HttpRequest,
    body: &serde_json::Value,
    order: NewOrder,
    respond: Respond,
) -> Result<(StoredResponse, bool), Problem> {
    let fingerprint = request_fingerprint(req.method().as_str(), req.match_info().as_str(), body)?;
    let Some(_in_flight) = InFlightKeys::begin(state, &client.0, &key.0) else {
        return Err(Problem::request_in_flight());
    };
    let outcome = state
        .store
        .create_order(CreateOrder {
            client: client.0,
            key: key.0,
            fingerprint,
            retention_secs: state.idempotency_retention_secs,
            order,
            respond,
        })
        .await
        .map_err(|e| {
            tracing::error!(error = %ErrorChain(&e), method = %req.method(), path = req.path(), "idempotent request not carried out");
            Problem::unavailable()
        })?;
    match outcome {
        IdempotentOutcome::Fresh(stored) => Ok((stored, false)),
        IdempotentOutcome::Replayed(stored) => Ok((stored, true)),
        IdempotentOutcome::FingerprintMismatch => Err(Problem::key_reused()),
        IdempotentOutcome::InFlight => Err(Problem::request_in_flight()),
    }
}

/// SHA-256 of `"METHOD path\n"` and the RFC 8785 (JCS) form of the body: key order and
/// whitespace do not change it; the query string is not part of it.
pub fn request_fingerprint(
    method: &str,
    path: &str,
    body: &serde_json::Value,
) -> Result<String, Problem> {
    use sha2::{Digest, Sha256};
    let canonical = serde_jcs::to_vec(body).map_err(|e| Problem::invalid_request(e.to_string()))?;
    let mut hasher = Sha256::new();
    hasher.update(format!("{method} {path}\n").as_bytes());
    hasher.update(&canonical);
    Ok(crate::domain::hex_lower(&hasher.finalize()))
}

/// A stored response as sent, marked `Idempotent-Replayed: true` when it is a replay.
pub fn stored_response(stored: &StoredResponse, replayed: bool) -> actix_web::HttpResponse {
    let status = actix_web::http::StatusCode::from_u16(stored.status)
        .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = actix_web::HttpResponse::build(status);
    response.insert_header((header::CONTENT_TYPE, stored.content_type.as_str()));
    if replayed {
        response.insert_header(("Idempotent-Replayed", "true"));
    }
    response.body(stored.body.clone())
}

/// Keys whose first request is being processed right now, per client. A concurrent request with
/// the same key gets 409 with Retry-After instead of waiting; once the first commits, retries
/// get its stored response.
#[derive(Debug, Default)]
pub struct InFlightKeys(Mutex<HashSet<(String, String)>>);

/// Holds a key as in flight until dropped (also when the request is cancelled).
pub struct InFlightGuard {
    state: web::Data<AppState>,
    entry: (String, String),
}

impl InFlightKeys {
    pub fn begin(state: &web::Data<AppState>, client: &str, key: &str) -> Option<InFlightGuard> {
        let entry = (client.to_owned(), key.to_owned());
        let fresh = state
            .in_flight
            .0
            .lock()
            .expect("in-flight lock")
            .insert(entry.clone());
        fresh.then(|| InFlightGuard {
            state: state.clone(),
            entry,
        })
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if let Ok(mut keys) = self.state.in_flight.0.lock() {
            keys.remove(&self.entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_idempotency_key;

    #[test]
    fn quoted_and_bare_forms_are_the_same_key() {
        assert_eq!(parse_idempotency_key("\"k-1\"").unwrap(), "k-1");
        assert_eq!(parse_idempotency_key("k-1").unwrap(), "k-1");
        assert_eq!(
            parse_idempotency_key("\"with space\"").unwrap(),
            "with space"
        );
    }

    #[test]
    fn malformed_keys_are_refused_with_a_reason() {
        assert!(parse_idempotency_key("").is_err());
        assert!(parse_idempotency_key("\"\"").is_err());
        assert!(parse_idempotency_key("two words").is_err());
        assert!(parse_idempotency_key("\"unterminated").is_err());
        assert!(parse_idempotency_key(&"a".repeat(256)).is_err());
        assert_eq!(parse_idempotency_key(&"a".repeat(255)).unwrap().len(), 255);
    }
}
