//! The transports that deliver rendered emails, and how their failures are classified.
//!
//! Transient failures (timeouts, SMTP 4xx, HTTP 408/429/5xx) are retried with backoff;
//! permanent ones (SMTP 5xx to MAIL FROM, RCPT or DATA, other HTTP 4xx) make the row dead at
//! once. A transport that cannot be reached or refuses sekali's credentials (SMTP connect, EHLO
//! or AUTH, including one that does not answer within half the send timeout; HTTP connect
//! errors and timeouts, 401) is [`SendError::Unavailable`]: not the row's failure, so it is not
//! counted against the row, and a down server or a wrong password cannot kill the queue.

use std::path::PathBuf;
use std::time::Duration;

use lettre::message::{header::ContentType, Mailbox, MultiPart, SinglePart};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use secrecy::{ExposeSecret, SecretString};

use super::eml::{self, DirSync};
use super::RenderedEmail;
use crate::domain::text::without_userinfo;

pub const ENV_SMTP_URL: &str = "SEKALI_SMTP_URL";
pub const ENV_MAIL_API_URL: &str = "SEKALI_MAIL_API_URL";
pub const ENV_MAIL_API_KEY: &str = "SEKALI_MAIL_API_KEY";
pub const ENV_MAIL_FROM: &str = "SEKALI_MAIL_FROM";
pub const DEFAULT_MAIL_FROM: &str = "sekali@localhost";
/// The most emails of a batch for a mail directory where each file is fsynced on its own.
pub const SYNCED_ONE_BY_ONE_BATCH: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// May heal: retried with backoff (`retry_after` when the server asked for a delay).
    Transient {
        reason: String,
        retry_after: Option<Duration>,
    },
    /// Will not heal: the row becomes dead.
    Permanent(String),
    /// The transport itself is down or refuses sekali's credentials; the row was never handed
    /// over. Not a try of the row: it waits for the transport (see `jobs::relay`).
    Unavailable(String),
    /// Not sent, because sending could deliver it twice: the row becomes dead without a try.
    Withheld(String),
}

impl SendError {
    pub fn transient(reason: impl Into<String>) -> Self {
        SendError::Transient {
            reason: reason.into(),
            retry_after: None,
        }
    }

    /// An HTTP request to `service` that got no answer: a connection never made is the
    /// service's unavailability (no try of the row); a failure after it (a timeout waiting for
    /// the answer: the request may have arrived) is a try that may heal.
    pub fn of_request(error: awc::error::SendRequestError, service: &str) -> Self {
        match error {
            awc::error::SendRequestError::Connect(e) => {
                SendError::Unavailable(format!("connecting to {service}: {e}"))
            }
            e => SendError::transient(format!("the request to {service} failed: {e}")),
        }
    }
}

/// Where emails go, from configuration.
#[derive(Debug, Clone)]
pub struct MailConfig {
    pub smtp_url: Option<SecretString>,
    pub http_url: Option<String>,
    pub http_api_key: Option<SecretString>,
    pub mail_dir: PathBuf,
    pub from: String,
    /// Longest a single transport attempt may take; the relay's lease must be longer.
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("{ENV_SMTP_URL} is not a usable SMTP URL: {0}")]
    SmtpUrl(String),
    #[error("{ENV_MAIL_API_URL} is set but {ENV_MAIL_API_KEY} is not")]
    MissingApiKey,
    #[error("{ENV_MAIL_FROM} `{0}` is not an email address")]
    From(String),
    #[error("{ENV_MAIL_API_URL} `{0}` is not an http:// or https:// URL")]
    ApiUrl(String),
    #[error("the mail directory {dir} cannot be created: {reason}")]
    MailDir { dir: String, reason: String },
}

pub enum Transport {
    /// Default: `<mail dir>/<idempotency key>.eml`; a resend finds the file written. A file is
    /// on the disk before its row is `sent` (see [`crate::mail::eml`]).
    File {
        dir: PathBuf,
        sync: DirSync,
        /// One batch is synced and named at a time: two namings at once only contend for the
        /// directory's lock (measured: a tenth of the relay's CPU spinning on it). Writing the
        /// next batch's unnamed files takes no such lock, and goes on beside it.
        naming: tokio::sync::Mutex<()>,
        /// The most emails a batch may carry (see [`eml::files_per_batch`]).
        files_per_batch: usize,
    },
    Smtp {
        transport: AsyncSmtpTransport<Tokio1Executor>,
        /// For connect, EHLO and AUTH: half the send timeout, so that a server that does not
        /// answer is found unavailable before the relay's own timeout counts a try.
        connect_timeout: Duration,
    },
    /// A JSON email API (to, from, subject, html, text) with the row's key in `Idempotency-Key`.
    Http {
        url: String,
        api_key: SecretString,
        timeout: Duration,
        /// Kept for the relay's life, so its connections are reused (`awc::Client` stays on
        /// the relay's thread).
        client: awc::Client,
    },
}

impl MailConfig {
    /// Reads the transport settings from the environment; `mail_dir` and `timeout` come from
    /// flags.
    pub fn from_env(mail_dir: PathBuf, timeout: Duration) -> Self {
        let var = |name| {
            std::env::var(name)
                .ok()
                .filter(|v: &String| !v.trim().is_empty())
        };
        MailConfig {
            smtp_url: var(ENV_SMTP_URL).map(SecretString::from),
            http_url: var(ENV_MAIL_API_URL),
            http_api_key: var(ENV_MAIL_API_KEY).map(SecretString::from),
            mail_dir,
            from: var(ENV_MAIL_FROM).unwrap_or_else(|| DEFAULT_MAIL_FROM.to_owned()),
            timeout,
        }
    }
}

impl MailConfig {
    /// True when the HTTP email API is the transport (SMTP comes first when both are set).
    pub fn uses_http_api(&self) -> bool {
        self.smtp_url.is_none() && self.http_url.is_some()
    }

    /// Checks the settings, and for the file transport creates the mail directory, so that a
    /// mistake stops startup instead of the first email; true when the HTTP email API is
    /// chosen.
    pub fn check(&self) -> Result<bool, TransportError> {
        self.from
            .parse::<Mailbox>()
            .map_err(|_| TransportError::From(self.from.clone()))?;
        if let Some(url) = &self.smtp_url {
            AsyncSmtpTransport::<Tokio1Executor>::from_url(url.expose_secret())
                .map_err(|e| TransportError::SmtpUrl(e.to_string()))?;
            return Ok(false);
        }
        if let Some(url) = &self.http_url {
            let parsed = url.parse::<awc::http::Uri>().ok();
            if !parsed.is_some_and(|u| {
                matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some()
            }) {
                // Never the password a URL may carry.
                return Err(TransportError::ApiUrl(without_userinfo(url)));
            }
            self.http_api_key
                .as_ref()
                .ok_or(TransportError::MissingApiKey)?;
            return Ok(true);
        }
        // The file transport: its directory must exist or be creatable now, not at the first
        // email; created, its name is made durable with it.
        crate::durable::create_dir_all(&self.mail_dir).map_err(|e| TransportError::MailDir {
            dir: self.mail_dir.display().to_string(),
            reason: e.to_string(),
        })?;
        Ok(false)
    }
}

impl Transport {
    /// Builds the configured transport. Must run inside the runtime that will use it (the SMTP
    /// connection pool starts a task).
    pub fn from_config(config: &MailConfig) -> Result<Self, TransportError> {
        config.check()?;
        if let Some(url) = &config.smtp_url {
            let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(url.expose_secret())
                // Never echo the URL: it may carry a password.
                .map_err(|e| TransportError::SmtpUrl(e.to_string()))?
                .timeout(Some(config.timeout))
                .build();
            return Ok(Transport::Smtp {
                transport,
                connect_timeout: config.timeout / 2,
            });
        }
        if let Some(url) = &config.http_url {
            let api_key = config
                .http_api_key
                .clone()
                .ok_or(TransportError::MissingApiKey)?;
            // A connection not made within half the send timeout is the transport's failure
            // (`SendRequestError::Connect`), found before the relay's own timeout counts a try.
            let client = awc::Client::builder()
                .connector(awc::Connector::new().timeout(config.timeout / 2))
                .timeout(config.timeout)
                .finish();
            return Ok(Transport::Http {
                url: url.clone(),
                api_key,
                timeout: config.timeout,
                client,
            });
        }
        Ok(Transport::File {
            dir: config.mail_dir.clone(),
            sync: DirSync::for_dir(&config.mail_dir),
            naming: tokio::sync::Mutex::new(()),
            files_per_batch: eml::files_per_batch(),
        })
    }

    /// The transport as the metrics' `transport` label: `file`, `smtp` or `http`.
    pub fn label(&self) -> &'static str {
        match self {
            Transport::File { .. } => "file",
            Transport::Smtp { .. } => "smtp",
            Transport::Http { .. } => "http",
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Transport::File {
                sync: DirSync::FileSystem,
                ..
            } => "mail directory (synced with one syncfs per batch)",
            Transport::File {
                sync: DirSync::EachFile,
                ..
            } => "mail directory (synced with an fsync per file)",
            Transport::Smtp { .. } => "smtp",
            Transport::Http { .. } => "http",
        }
    }

    /// Where the file transport writes; `None` for the others.
    pub fn mail_dir(&self) -> Option<&std::path::Path> {
        match self {
            Transport::File { dir, .. } => Some(dir),
            _ => None,
        }
    }

    /// Delivers a relay's batch; the results are in the order of `emails`, each `Ok` only once
    /// the transport confirmed it. SMTP and the HTTP API send the emails concurrently (SMTP
    /// over lettre's pool of connections, the API over one client's), each within `timeout`;
    /// files are built into messages and written, still unnamed, off the event loop (beside the
    /// syncing and naming of the batch before), then synced and named as one durable batch
    /// (see [`eml`]), each of the two within `timeout`. A message that cannot be built fails
    /// alone.
    pub async fn send_batch(
        &self,
        emails: Vec<RenderedEmail>,
        timeout: Duration,
    ) -> Vec<Result<(), SendError>> {
        if emails.is_empty() {
            return Vec::new();
        }
        match self {
            Transport::File {
                dir, sync, naming, ..
            } => {
                let count = emails.len();
                // Building the messages and writing them into unnamed files costs CPU, and
                // takes no lock of the directory's (`O_TMPFILE`): it runs on another core while
                // the batch before is synced and named, which is mostly a wait for the disk.
                let (dir, sync) = (dir.clone(), *sync);
                let written = blocking_within(timeout, move || {
                    let mut messages = Messages::default();
                    let mut files = Vec::with_capacity(emails.len());
                    let slots: Vec<Result<(), SendError>> = emails
                        .iter()
                        .map(|email| {
                            let bytes = messages.bytes(email)?;
                            files.push((email.idempotency_key.clone(), bytes));
                            Ok(())
                        })
                        .collect();
                    (slots, eml::write_unsynced(&dir, &files, sync))
                });
                let (slots, unsynced) = match written.await {
                    Ok(written) => written,
                    Err(error) => return vec![Err(error); count],
                };
                let written = match unsynced {
                    Ok(unsynced) => {
                        let _one_at_a_time = naming.lock().await;
                        match blocking_within(timeout, move || unsynced.sync_and_name()).await {
                            Ok(written) => written,
                            Err(error) => return vec![Err(error); count],
                        }
                    }
                    // Nothing was written (the directory could not be made or opened): each
                    // message that was built fails with that, one that was not keeps its reason.
                    Err(error) => {
                        vec![Err(error); slots.iter().filter(|slot| slot.is_ok()).count()]
                    }
                };
                let mut written = written.into_iter();
                slots
                    .into_iter()
                    .map(|slot| {
                        slot.and_then(|()| {
                            let written = written.next().expect("one result per file");
                            written.map_err(|e| SendError::transient(e.to_string()))
                        })
                    })
                    .collect()
            }
            Transport::Smtp {
                transport,
                connect_timeout,
            } => {
                let mut messages = Messages::default();
                let built: Vec<_> = emails.iter().map(|email| messages.build(email)).collect();
                each_within(
                    timeout,
                    built
                        .into_iter()
                        .map(|message| send_smtp(transport, *connect_timeout, message)),
                )
                .await
            }
            Transport::Http {
                url,
                api_key,
                timeout: api_timeout,
                client,
            } => {
                each_within(
                    timeout,
                    emails
                        .iter()
                        .map(|email| send_http(client, url, api_key, *api_timeout, email)),
                )
                .await
            }
        }
    }

    /// The most rows a batch should carry on this transport, whatever the relay would claim.
    /// Files: no more than the process may hold open (see [`eml::files_per_batch`]); where each
    /// is fsynced on its own (FUSE, NFS), [`SYNCED_ONE_BY_ONE_BATCH`], since a larger batch
    /// saves no sync there, and thousands of fsyncs could outlast the transport's timeout.
    pub fn batch_limit(&self) -> usize {
        match self {
            Transport::File {
                sync,
                files_per_batch,
                ..
            } => match sync {
                DirSync::EachFile => SYNCED_ONE_BY_ONE_BATCH.min(*files_per_batch),
                DirSync::FileSystem => *files_per_batch,
            },
            Transport::Smtp { .. } | Transport::Http { .. } => usize::MAX,
        }
    }

    pub fn is_http(&self) -> bool {
        matches!(self, Transport::Http { .. })
    }
}

/// Runs `work` on a blocking thread, off the event loop, within `timeout`. `Err`: why it gave
/// no answer, which is every email's of the batch.
async fn blocking_within<T: Send + 'static>(
    timeout: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, SendError> {
    match tokio::time::timeout(timeout, actix_web::rt::task::spawn_blocking(work)).await {
        Ok(Ok(done)) => Ok(done),
        Ok(Err(_)) => Err(SendError::transient("writing the mail directory failed")),
        Err(_) => Err(timed_out(timeout)),
    }
}

fn timed_out(timeout: Duration) -> SendError {
    SendError::Transient {
        reason: format!("the transport timed out after {timeout:?}"),
        retry_after: None,
    }
}

/// Runs `sends` concurrently, each within `timeout`; the results in their order.
async fn each_within(
    timeout: Duration,
    sends: impl Iterator<Item = impl std::future::Future<Output = Result<(), SendError>>>,
) -> Vec<Result<(), SendError>> {
    futures_util::future::join_all(sends.map(|send| async move {
        tokio::time::timeout(timeout, send)
            .await
            .unwrap_or_else(|_| Err(timed_out(timeout)))
    }))
    .await
}

/// Sends one message over SMTP (or fails as its building did).
async fn send_smtp(
    transport: &AsyncSmtpTransport<Tokio1Executor>,
    connect_timeout: Duration,
    message: Result<Message, SendError>,
) -> Result<(), SendError> {
    let message = message?;
    // Connection, EHLO and AUTH first: their failures are the transport's, whatever the reply
    // code, so that a bad password or a down server never kills a row.
    match tokio::time::timeout(connect_timeout, transport.test_connection()).await {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) => {
            return Err(SendError::Unavailable(
                "the SMTP server is not ready".into(),
            ))
        }
        Ok(Err(e)) => {
            return Err(SendError::Unavailable(format!(
                "connecting to the SMTP server: {e}"
            )))
        }
        Err(_) => {
            return Err(SendError::Unavailable(format!(
                "connecting to the SMTP server: no answer within {connect_timeout:?}"
            )))
        }
    }
    match transport.send(message).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_permanent() => Err(SendError::Permanent(format!("SMTP: {e}"))),
        Err(e) => Err(SendError::transient(format!("SMTP: {e}"))),
    }
}

/// Builds messages, parsing the sender's address once for the emails that share it (a relay's
/// all do): parsing addresses is a good part of what building a message costs.
#[derive(Default)]
pub struct Messages {
    from: Option<(String, Mailbox)>,
}

impl Messages {
    /// The email as the bytes of one RFC 5322 message (what a `.eml` file holds).
    pub fn bytes(&mut self, email: &RenderedEmail) -> Result<Vec<u8>, SendError> {
        Ok(self.build(email)?.formatted())
    }

    fn build(&mut self, email: &RenderedEmail) -> Result<Message, SendError> {
        let from = match &self.from {
            Some((text, mailbox)) if *text == email.from => mailbox.clone(),
            _ => {
                let mailbox: Mailbox = email
                    .from
                    .parse()
                    .map_err(|e| SendError::Permanent(format!("sender address: {e}")))?;
                self.from = Some((email.from.clone(), mailbox.clone()));
                mailbox
            }
        };
        // A bare address (what `render` gives) is checked without the parser of display names.
        let to = match email.to.parse::<lettre::Address>() {
            Ok(address) => Mailbox::new(None, address),
            Err(_) => email
                .to
                .parse::<Mailbox>()
                .map_err(|e| SendError::Permanent(format!("recipient address: {e}")))?,
        };
        // Given, lettre need not parse the two addresses back out of the headers it was given.
        let envelope =
            lettre::address::Envelope::new(Some(from.email.clone()), vec![to.email.clone()])
                .map_err(|e| SendError::Permanent(format!("building the message: {e}")))?;
        Message::builder()
            .from(from)
            .to(to)
            .envelope(envelope)
            .subject(email.subject.clone())
            .message_id(Some(email.message_id.clone()))
            .multipart(
                MultiPart::alternative()
                    .singlepart(
                        SinglePart::builder()
                            .header(ContentType::TEXT_PLAIN)
                            .body(email.text.clone()),
                    )
                    .singlepart(
                        SinglePart::builder()
                            .header(ContentType::TEXT_HTML)
                            .body(email.html.clone()),
                    ),
            )
            .map_err(|e| SendError::Permanent(format!("building the message: {e}")))
    }
}

async fn send_http(
    client: &awc::Client,
    url: &str,
    api_key: &SecretString,
    timeout: Duration,
    email: &RenderedEmail,
) -> Result<(), SendError> {
    let body = serde_json::json!({
        "from": email.from, "to": [email.to], "subject": email.subject,
        "html": email.html, "text": email.text,
        "headers": {"Message-ID": email.message_id},
    });
    let mut response = client
        .post(url)
        .timeout(timeout)
        .insert_header((
            "Authorization",
            format!("Bearer {}", api_key.expose_secret()),
        ))
        .insert_header(("Idempotency-Key", email.idempotency_key.as_str()))
        .send_json(&body)
        .await
        .map_err(|e| SendError::of_request(e, "the email API"))?;
    if response.status().is_success() {
        return Ok(());
    }
    let crate::clients::Refusal {
        status,
        retry_after,
        text,
    } = crate::clients::refusal(&mut response).await;
    let reason = format!("email API answered {status}: {text}");
    match status {
        // The API refuses sekali's key: true of every row alike. (A 403 can be about one
        // recipient, as with a test-mode account, so it stays permanent.)
        401 => Err(SendError::Unavailable(reason)),
        408 | 429 | 500..=599 => Err(SendError::Transient {
            reason,
            retry_after: if status == 429 || status == 503 {
                retry_after
            } else {
                None
            },
        }),
        _ => Err(SendError::Permanent(reason)),
    }
}

#[cfg(test)]
mod tests {
    use super::DirSync;
    use crate::mail::eml::tests::names;

    fn email(key: &str, to: &str) -> crate::mail::RenderedEmail {
        crate::mail::RenderedEmail {
            from: "Toko Sari <shop@toko.example>".into(),
            to: to.into(),
            subject: "Pembayaran diterima".into(),
            text: "Terima kasih.".into(),
            html: "<p>Terima kasih.</p>".into(),
            idempotency_key: key.into(),
            message_id: format!("<{key}@toko.example>"),
        }
    }

    /// Sends `batch` through the file transport into `mail`.
    fn send_files(
        mail: &std::path::Path,
        batch: Vec<crate::mail::RenderedEmail>,
    ) -> Vec<Result<(), super::SendError>> {
        let transport = super::Transport::File {
            dir: mail.to_owned(),
            sync: DirSync::FileSystem,
            naming: tokio::sync::Mutex::new(()),
            files_per_batch: 3,
        };
        actix_web::rt::System::new()
            .block_on(transport.send_batch(batch, std::time::Duration::from_secs(30)))
    }

    /// A message that cannot be built fails alone, permanently; the rest of its batch is
    /// written as usual.
    #[test]
    fn a_message_that_cannot_be_built_fails_alone_and_its_batch_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let mail = dir.path().join("mail");
        let batch = vec![
            email("good0", "a@example.com"),
            email("bad", "not an address"),
            email("good1", "b@example.com"),
        ];
        let results = send_files(&mail, batch);
        assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
        assert!(
            matches!(&results[1], Err(super::SendError::Permanent(reason)) if reason.contains("recipient address")),
            "{results:?}"
        );
        assert_eq!(names(&mail), ["good0.eml", "good1.eml"]);
        let text = std::fs::read_to_string(mail.join("good1.eml")).unwrap();
        assert!(text.contains("To: b@example.com"), "{text}");
    }

    /// A mail directory that cannot be made fails the batch's built messages for a retry,
    /// saying why, and a message that could not be built keeps its own, permanent, reason.
    #[test]
    fn a_mail_directory_that_cannot_be_made_fails_the_batch_for_a_retry_and_keeps_each_reason() {
        let dir = tempfile::tempdir().unwrap();
        let not_a_dir = dir.path().join("file");
        std::fs::write(&not_a_dir, b"").unwrap();
        let batch = vec![
            email("good0", "a@example.com"),
            email("bad", "not an address"),
        ];
        let results = send_files(&not_a_dir.join("mail"), batch);
        assert!(
            matches!(&results[0], Err(super::SendError::Transient { reason, .. }) if reason.contains("creating it in the mail directory")),
            "{results:?}"
        );
        assert!(
            matches!(&results[1], Err(super::SendError::Permanent(reason)) if reason.contains("recipient address")),
            "{results:?}"
        );
    }
}
