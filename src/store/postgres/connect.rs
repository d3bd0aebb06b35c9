//! Where the database is: a `postgres://` URL, read and checked, and connections to it.
//!
//! The URL is libpq's (`postgres://user:password@host:port/db?option=value`), parsed by
//! `tokio-postgres`: several hosts (`host1:5432,host2:5432`) with
//! `target_session_attrs=read-write` make a connection go to whichever host is the primary, so
//! after a failover sekali reconnects to the promoted standby by itself. A password comes from
//! the URL or, as with libpq, from `PGPASSWORD`; it is never printed: a [`Target`] shows as its
//! hosts, port, user and database only.
//!
//! TLS: `sslmode=require` (or libpq's `verify-ca` and `verify-full`) connects over TLS (rustls)
//! and always verifies the server's certificate and its name, as libpq's `verify-full` does:
//! against the CA file `PGSSLROOTCERT` names, as with libpq, else the Mozilla roots (a
//! provider-issued certificate). `prefer` (the default) and `disable` connect without TLS, as
//! sekali did before it had TLS: over a unix socket or a private network.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use postgres::config::{Host, SslMode};
use postgres::tls::MakeTlsConnect;
use postgres::Client;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::store::StoreError;

/// How long one attempt to connect may take, unless the URL sets `connect_timeout`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a statement waits for a lock another session holds (a row, an advisory lock) before
/// it fails: SQLite's busy timeout, so that both engines answer a stuck lock alike.
pub const LOCK_TIMEOUT: Duration = crate::store::sqlite::DEFAULT_BUSY_TIMEOUT;

/// libpq's variable naming the CA certificates a server's certificate is checked against.
pub const ENV_ROOT_CERT: &str = "PGSSLROOTCERT";

/// A PostgreSQL database named by a URL.
#[derive(Clone)]
pub struct Target {
    config: postgres::Config,
    /// The TLS every connection is made with: used only under `sslmode=require`.
    tls: Tls,
    /// The URL set `application_name`: every connection keeps it (see [`Target::named`]).
    named_by_url: bool,
}

impl Target {
    /// Reads a `postgres://` (or `postgresql://`) URL; an error names what is wrong with it and
    /// never repeats a password.
    pub fn parse(url: &str) -> Result<Target, StoreError> {
        // libpq's stricter modes: sekali verifies the certificate and its name under `require`
        // already, which the driver reads; verify-ca is met by checking more, not less.
        let url = url
            .replace("sslmode=verify-full", "sslmode=require")
            .replace("sslmode=verify-ca", "sslmode=require");
        let url = url.as_str();
        let mut config = postgres::Config::from_str(url).map_err(|e| {
            StoreError::Unfit(format!(
                "the database URL {} is not one PostgreSQL accepts: {}",
                redact(url),
                crate::telemetry::ErrorChain(&e)
            ))
        })?;
        if config.get_hosts().is_empty() {
            return Err(StoreError::Unfit(format!(
                "the database URL {} names no host",
                redact(url)
            )));
        }
        let tls = config.get_ssl_mode() == SslMode::Require;
        if !tls {
            // `prefer` would try TLS wherever the server offers it, and fail on a certificate
            // nobody asked to verify (Debian's own clusters offer a self-signed one).
            config.ssl_mode(SslMode::Disable);
        }
        if config.get_password().is_none() {
            if let Ok(password) = std::env::var("PGPASSWORD") {
                config.password(password);
            }
        }
        if config.get_user().is_none() {
            // libpq's default: the operating system's user name.
            let user = std::env::var("PGUSER")
                .ok()
                .or_else(|| whoami::username().ok());
            if let Some(user) = user {
                config.user(&user);
            }
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
        }
        let named_by_url = config.get_application_name().is_some();
        if !named_by_url {
            config.application_name("sekali");
        }
        Ok(Target {
            config,
            tls: Tls {
                rustls: tls_connector(tls)?,
                used: tls,
            },
            named_by_url,
        })
    }

    /// Opens a connection and checks that the server keeps commits on disk before it
    /// acknowledges them and sets what sekali needs of a session (see [`prepare_session`]).
    pub fn connect(&self) -> Result<Client, StoreError> {
        let mut client = self.config.connect(self.tls.clone()).map_err(|e| {
            let reason = match e.as_db_error() {
                Some(db) => format!("{} ({})", db.message(), db.code().code()),
                None => crate::telemetry::ErrorChain(&e).to_string(),
            };
            StoreError::CannotConnect {
                target: self.to_string(),
                reason,
            }
        })?;
        prepare_session(&mut client, self)?;
        Ok(client)
    }

    /// The same database, its connections named `name` in `pg_stat_activity` (`sekali writer`:
    /// an operator tells the writers from the reads), unless the URL named them.
    pub fn named(&self, name: &str) -> Target {
        let mut target = self.clone();
        if !self.named_by_url {
            target.config.application_name(name);
        }
        target
    }

    /// The driver's settings (for the read pool's connections).
    pub(super) fn config(&self) -> &postgres::Config {
        &self.config
    }

    /// The TLS its connections are made with (for the read pool's).
    pub(super) fn tls(&self) -> Tls {
        self.tls.clone()
    }

    /// The database's name, for messages.
    pub fn database(&self) -> &str {
        self.config.get_dbname().unwrap_or("(the user's)")
    }
}

/// How a connection is made: over TLS (rustls) under `sslmode=require`, else in the clear.
///
/// The driver asks for a TLS connector for every connection, TLS or not, naming the host: none
/// for a unix socket, which no TLS server name can be. In the clear the connector is never used
/// (the driver's `sslmode` is `disable` then), so it is made for a placeholder name; under
/// `sslmode=require` a unix socket is refused, naming the setting, as a certificate cannot be
/// checked against it.
#[derive(Clone)]
pub struct Tls {
    rustls: MakeRustlsConnect,
    used: bool,
}

impl<S> MakeTlsConnect<S> for Tls
where
    MakeRustlsConnect: MakeTlsConnect<S>,
{
    type Stream = <MakeRustlsConnect as MakeTlsConnect<S>>::Stream;
    type TlsConnect = <MakeRustlsConnect as MakeTlsConnect<S>>::TlsConnect;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn make_tls_connect(&mut self, host: &str) -> Result<Self::TlsConnect, Self::Error> {
        let name = match (self.used, host) {
            (true, "") => {
                return Err("sslmode=require needs a TCP host: a unix socket cannot be \
                            checked against a certificate (connect by host name, or drop sslmode)"
                    .into())
            }
            (true, host) => host,
            (false, _) => "localhost",
        };
        MakeTlsConnect::<S>::make_tls_connect(&mut self.rustls, name).map_err(Into::into)
    }
}

/// The TLS client: the CAs of `PGSSLROOTCERT` when it is set (and TLS is `used`), else the
/// Mozilla roots; the server's name always checked. A `PGSSLROOTCERT` that cannot be read, or
/// holds no certificate, is refused, naming it.
fn tls_connector(used: bool) -> Result<MakeRustlsConnect, StoreError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    match std::env::var_os(ENV_ROOT_CERT).filter(|v| used && !v.is_empty()) {
        Some(path) => {
            let refuse = |why: String| {
                StoreError::Unfit(format!(
                    "{ENV_ROOT_CERT}={}: {why}",
                    crate::domain::text::Escaped(&path.to_string_lossy())
                ))
            };
            let certificates = CertificateDer::pem_file_iter(&path)
                .map_err(|e| refuse(format!("cannot be read: {e}")))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| refuse(format!("is not PEM certificates: {e}")))?;
            if certificates.is_empty() {
                return Err(refuse("holds no certificate".into()));
            }
            for certificate in certificates {
                roots
                    .add(certificate)
                    .map_err(|e| refuse(format!("a certificate is not usable: {e}")))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Unfit(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// sekali answers 2xx only after COMMIT returns, which promises durability only if the server
/// flushes its WAL before it answers. `synchronous_commit` is set on for sekali's sessions
/// whatever the server's default (`off` would acknowledge commits a crash loses); `fsync` cannot
/// be set per session, so a server running with `fsync=off` is refused.
fn prepare_session(client: &mut Client, target: &Target) -> Result<(), StoreError> {
    // A lock another session holds longer than SQLite's busy timeout fails the statement
    // (55P03, transient: 503, which providers retry) rather than holding the delivery.
    client.batch_execute(&format!(
        "SET synchronous_commit = on; SET lock_timeout = '{}ms'",
        LOCK_TIMEOUT.as_millis()
    ))?;
    let fsync: String = client.query_one("SHOW fsync", &[])?.try_get(0)?;
    if fsync != "on" {
        return Err(StoreError::Unfit(format!(
            "the PostgreSQL server of {target} runs with fsync={fsync}: a commit it acknowledges can be lost in a crash, and sekali answers 2xx only for what is durable; set fsync=on in postgresql.conf"
        )));
    }
    Ok(())
}

impl fmt::Display for Target {
    /// `host1:5432,host2:5432/db (user sekali)`: no password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ports = self.config.get_ports();
        for (i, host) in self.config.get_hosts().iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match host {
                Host::Tcp(name) => f.write_str(name)?,
                Host::Unix(path) => write!(f, "{}", path.display())?,
            }
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            write!(f, ":{port}")?;
        }
        write!(
            f,
            "/{} (user {})",
            self.database(),
            self.config.get_user().unwrap_or("?")
        )
    }
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Target({self})")
    }
}

/// True when `text` names a PostgreSQL database rather than a SQLite file.
pub fn is_url(text: &str) -> bool {
    text.starts_with("postgres://") || text.starts_with("postgresql://")
}

/// `url` with the password of its user part, if any, replaced by `***`.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    // The credentials end at the first `@`, wherever it is, as the driver reads them: a
    // password with a `/` or `?` in it (not percent-encoded) still connects, and is still one.
    let shown = match rest.split_once('@') {
        Some((user_part, hosts)) => {
            let user = user_part.split(':').next().unwrap_or("");
            let hidden = if user_part.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{hidden}@{hosts}")
        }
        None => url.to_owned(),
    };
    // `?password=…` is a libpq option too.
    let Some((head, query)) = shown.split_once('?') else {
        return shown;
    };
    let options: Vec<&str> = query
        .split('&')
        .map(|option| match option.split_once('=') {
            Some(("password", _)) => "password=***",
            _ => option,
        })
        .collect();
    format!("{head}?{}", options.join("&"))
}

#[cfg(test)]
mod tests {
    use super::{redact, Target};

    #[test]
    fn a_url_shows_without_its_password() {
        assert_eq!(
            redact("postgres://shop:s3cret@db1:5432,db2:5432/sekali?sslmode=disable"),
            "postgres://shop:***@db1:5432,db2:5432/sekali?sslmode=disable"
        );
        assert_eq!(
            redact("postgresql://db/sekali?user=shop&password=s3cret"),
            "postgresql://db/sekali?user=shop&password=***"
        );
        // A password with a `/` or a `?` in it, not percent-encoded: the driver takes it whole.
        for url in [
            "postgres://shop:s3/cret@db/sekali",
            "postgres://shop:s3?cret@db/sekali",
        ] {
            assert_eq!(redact(url), "postgres://shop:***@db/sekali");
            assert!(Target::parse(url).is_ok(), "{url}");
        }
        let target = Target::parse("postgres://shop:s3cret@db1:5433,db2/sekali").unwrap();
        let shown = format!("{target} {target:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert_eq!(target.to_string(), "db1:5433,db2:5432/sekali (user shop)");
    }

    #[test]
    fn an_unknown_option_is_named_and_no_password_is_repeated() {
        let error = Target::parse("postgres://shop:s3cret@db/sekali?sslmod=disable")
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown option `sslmod`"), "{error}");
        assert!(!error.contains("s3cret"), "{error}");
    }
}
