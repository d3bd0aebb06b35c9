//! Who may use the console: a login with one of its tokens gives a session cookie, and every
//! form a CSRF token bound to that session.
//!
//! Nothing is kept on the server. The cookie is `issued.nonce.mac`, the MAC an HMAC-SHA256 keyed
//! with the token that logged in, so any instance with the same tokens accepts it (several
//! instances behind a load balancer need no shared session store), and rotating a token out ends
//! its sessions. The cookie does not contain the token. The CSRF token is another HMAC of the
//! cookie's value under the same key: a form from an earlier session (or another operator's)
//! does not match.

use actix_web::cookie::{Cookie, SameSite};
use actix_web::http::header;
use actix_web::HttpRequest;
use hmac::{Hmac, Mac};
use secrecy::ExposeSecret;
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::config::ApiToken;

pub const COOKIE: &str = "sekali_console";
const PATH: &str = "/console";

/// How long a login lasts: a working day.
pub const LIFETIME_SECS: i64 = 12 * 3600;

/// A logged-in operator, as one request shows it.
#[derive(Debug, Clone)]
pub struct Session {
    /// The name of the token that logged in: recorded as the operator of a set-status.
    pub operator: String,
    /// What this session's forms must send back.
    pub csrf: String,
    /// Hex SHA-256 of the cookie's value: what a logout records (`console_logouts`).
    pub id: String,
    /// When it ends by itself, in Unix seconds.
    pub expires_unix: i64,
}

impl Session {
    /// `code` with a tag that only this session can make, for the page at `path`: a notice a
    /// redirect carries in its URL, which a link from elsewhere cannot forge, and which no other
    /// page shows.
    pub fn signed_notice(&self, code: &str, path: &str) -> String {
        format!("{code}.{}", self.notice_tag(code, path))
    }

    /// The code of a notice this session signed for the page at `path`; `None` for any other
    /// text.
    pub fn notice_code<'a>(&self, signed: &'a str, path: &str) -> Option<&'a str> {
        let (code, tag) = signed.rsplit_once('.')?;
        bool::from(self.notice_tag(code, path).as_bytes().ct_eq(tag.as_bytes())).then_some(code)
    }

    fn notice_tag(&self, code: &str, path: &str) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(self.csrf.as_bytes())
            .expect("HMAC takes a key of any length");
        mac.update(b"notice\0");
        mac.update(path.as_bytes());
        mac.update(b"\0");
        mac.update(code.as_bytes());
        hex::encode(&mac.finalize().into_bytes()[..12])
    }
}

fn mac(token: &ApiToken, parts: &[&str]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(token.token.expose_secret().as_bytes())
        .expect("HMAC takes a key of any length");
    for part in parts {
        mac.update(part.as_bytes());
        mac.update(b"\0");
    }
    mac
}

/// A new session's cookie value for `token`, issued at `now_unix`.
pub fn issue(token: &ApiToken, now_unix: i64) -> String {
    let mut nonce = [0u8; 16];
    getrandom::fill(&mut nonce).expect("the operating system's random source");
    let issued = now_unix.to_string();
    let nonce = hex::encode(nonce);
    let tag = hex::encode(
        mac(token, &["session", &issued, &nonce])
            .finalize()
            .into_bytes(),
    );
    format!("{issued}.{nonce}.{tag}")
}

/// The session `value` (a cookie's) stands for at `now_unix`: none when it is malformed,
/// expired, or made with no token of `tokens`. Every token is tried, whatever matches first.
pub fn check(tokens: &[ApiToken], value: &str, now_unix: i64) -> Option<Session> {
    let mut parts = value.split('.');
    let (Some(issued), Some(nonce), Some(tag), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let issued_at: i64 = issued.parse().ok()?;
    let age = now_unix - issued_at;
    if !(-60..LIFETIME_SECS).contains(&age) {
        return None;
    }
    // Only the tag as issued, lower-case hex: the session's id (what a logout records) and its
    // CSRF token come from the cookie's text, which must have one spelling per session.
    let tag_text = tag;
    let tag = hex::decode(tag_text).ok()?;
    if hex::encode(&tag) != tag_text {
        return None;
    }
    let mut session = None;
    for token in tokens {
        if mac(token, &["session", issued, nonce])
            .verify_slice(&tag)
            .is_ok()
        {
            session = Some(Session {
                operator: token.name.clone(),
                csrf: hex::encode(mac(token, &["csrf", value]).finalize().into_bytes()),
                id: hex::encode(<Sha256 as sha2::Digest>::digest(value.as_bytes())),
                expires_unix: issued_at + LIFETIME_SECS,
            });
        }
    }
    session
}

/// Whether a form's `presented` CSRF token is the session's.
pub fn csrf_matches(session: &Session, presented: &str) -> bool {
    bool::from(session.csrf.as_bytes().ct_eq(presented.as_bytes()))
}

/// The session of `req`'s cookie, if it has a valid one.
pub fn of_request(req: &HttpRequest, tokens: &[ApiToken], now_unix: i64) -> Option<Session> {
    check(tokens, req.cookie(COOKIE)?.value(), now_unix)
}

/// Whether the request's host is this machine: a browser there talks plain HTTP, so the cookie
/// cannot be `Secure`. Anywhere else the console is reached through TLS (a proxy in front), and
/// the cookie is.
fn is_local(req: &HttpRequest) -> bool {
    let info = req.connection_info();
    let host = info.host();
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or(rest)
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    };
    matches!(name, "localhost" | "127.0.0.1" | "::1")
}

/// The session cookie: `HttpOnly` (no script reads it), `SameSite=Strict` (no other site's page
/// sends it), `Secure` unless on localhost, for the console's paths only.
pub fn cookie(req: &HttpRequest, value: String) -> Cookie<'static> {
    Cookie::build(COOKIE, value)
        .path(PATH)
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(!is_local(req))
        .max_age(actix_web::cookie::time::Duration::seconds(LIFETIME_SECS))
        .finish()
}

/// The cookie that ends a session in the browser.
pub fn removal(req: &HttpRequest) -> Cookie<'static> {
    let mut cookie = cookie(req, String::new());
    cookie.make_removal();
    cookie
}

/// Why a POST is refused before its session or form is looked at: it came from another page
/// than the console's own. Browsers send `Origin` with every POST and `Sec-Fetch-Site` with
/// most; a request with neither is not a browser's (a script with the cookie has the token
/// too), so it is let through to the CSRF check.
pub fn foreign_origin(req: &HttpRequest) -> Option<String> {
    let headers = req.headers();
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        if site == "cross-site" || site == "same-site" {
            return Some(format!("Sec-Fetch-Site: {site}"));
        }
    }
    let origin = headers.get(header::ORIGIN)?;
    let Ok(origin) = origin.to_str() else {
        return Some("an Origin that is not text".to_owned());
    };
    let authority = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"));
    let info = req.connection_info();
    if authority == Some(info.host()) {
        None
    } else {
        Some(format!(
            "Origin {} is not this console's",
            crate::domain::text::Escaped(origin)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::SecretString;

    fn token(name: &str, secret: &str) -> ApiToken {
        ApiToken {
            name: name.to_owned(),
            token: SecretString::from(secret.to_owned()),
        }
    }

    #[test]
    fn a_session_holds_for_its_lifetime_with_its_token_only_and_names_its_operator() {
        let ana = token("ana", "first-secret");
        let budi = token("budi", "second-secret");
        let value = issue(&ana, 1_000);
        assert!(!value.contains("first-secret"));
        let session = check(&[budi.clone(), ana.clone()], &value, 1_000 + 60).unwrap();
        assert_eq!(session.operator, "ana");
        assert!(
            check(std::slice::from_ref(&budi), &value, 1_060).is_none(),
            "another token's"
        );
        assert!(
            check(std::slice::from_ref(&ana), &value, 1_000 + LIFETIME_SECS).is_none(),
            "expired"
        );
        let last = if value.ends_with('a') { 'b' } else { 'a' };
        let forged = format!("{}{last}", &value[..value.len() - 1]);
        assert!(
            check(std::slice::from_ref(&ana), &forged, 1_060).is_none(),
            "a changed tag"
        );
        let later = issue(&ana, 1_000);
        let other = check(std::slice::from_ref(&ana), &later, 1_060).unwrap();
        assert_ne!(
            other.csrf, session.csrf,
            "each session has its own CSRF token"
        );
        assert!(csrf_matches(&session, &session.csrf.clone()));
        assert!(!csrf_matches(&session, &other.csrf));
        assert_eq!(session.expires_unix, 1_000 + LIFETIME_SECS);
        assert_ne!(session.id, other.id);
        let notice = session.signed_notice("email-skipped:5", "/console/outbox");
        assert_eq!(
            session.notice_code(&notice, "/console/outbox"),
            Some("email-skipped:5")
        );
        assert_eq!(
            session.notice_code(&notice, "/console/orders/x"),
            None,
            "another page's"
        );
        assert_eq!(
            other.notice_code(&notice, "/console/outbox"),
            None,
            "another session's"
        );
        assert_eq!(
            session.notice_code(
                "email-skipped:5.0123456789abcdef01234567",
                "/console/outbox"
            ),
            None
        );
        let dot = value.rfind('.').unwrap() + 1;
        let upper = format!("{}{}", &value[..dot], value[dot..].to_uppercase());
        assert!(
            check(std::slice::from_ref(&ana), &upper, 1_060).is_none(),
            "the tag in capitals is another spelling of the session, with another id"
        );
    }
}
