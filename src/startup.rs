//! Building and running the HTTP server.

use std::net::TcpListener;

use actix_web::dev::{Server, ServerHandle};
use actix_web::{web, App, HttpServer};
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::config::{ConfigError, Settings};
use crate::jobs::purge::run_purge_job;
use crate::routes::{self, AppState};
use crate::store::sqlite::{SqliteStore, WriterConfig};
use crate::store::{Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot open the database: {0}")]
    Store(#[from] StoreError),
    #[error("outbox relay: {0}")]
    Relay(#[from] crate::jobs::relay::RelayConfigError),
    #[error("outbox relay: {0}")]
    Mail(#[from] crate::mail::transport::TransportError),
    #[error("cannot listen on {address}: {source}{}", bind_hint(.source))]
    Bind {
        address: String,
        source: std::io::Error,
    },
}

fn bind_hint(source: &std::io::Error) -> &'static str {
    match source.kind() {
        std::io::ErrorKind::AddrInUse => {
            " (another program, or another sekali, listens there: choose another address with \
             --listen or SEKALI_LISTEN, e.g. --listen 127.0.0.1:8081)"
        }
        std::io::ErrorKind::PermissionDenied => {
            " (ports below 1024 need privileges: choose a higher port with --listen or SEKALI_LISTEN)"
        }
        _ => "",
    }
}

/// What each provider says about its settings, and a retention shorter than the provider's
/// redelivery window, which lets a redelivery after it count as new: allowed (tests and soaks
/// shorten it on purpose), but said at startup.
fn warn_of_provider_settings(settings: &Settings) {
    for provider in settings.providers.iter() {
        for warning in provider.startup_warnings() {
            tracing::warn!(provider = %provider.name(), "{warning}");
        }
        if provider.retention() < provider.redelivery_window() {
            let name = provider.name();
            tracing::warn!(
                provider = %name,
                "the {name} retention ({}) is shorter than the time in which {name} may deliver an \
                 event again ({}): a redelivery after it is processed as a new event (raise it \
                 with --retention {name}=DURATION)",
                humantime::format_duration(provider.retention()),
                humantime::format_duration(provider.redelivery_window()),
            );
        }
    }
}

/// Logs the deliveries refused for a full write queue once a second, and the last ones when
/// the server stops (after its requests have finished).
async fn report_refusals(refused: std::sync::Arc<routes::Refused>, shutdown: CancellationToken) {
    let mut every_second = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = every_second.tick() => refused.report(),
        }
    }
    refused.report();
}

/// SIGTERM and SIGINT (ctrl-c) stop the server gracefully: it stops accepting, answers every
/// request in flight, then shuts down in order ([`Application::run_until_stopped`]). A second
/// signal stops it at once, for someone who does not want to wait.
///
/// The handlers are installed by this call, not when the returned future first runs: `build`
/// calls it before it logs that it listens, so a SIGTERM sent as soon as that line is out stops
/// the server gracefully too (it used to kill it, the handlers not being there yet).
fn stop_on_signals(server: ServerHandle) -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    stop_on(handlers, server)
}

/// The future of [`stop_on_signals`], on its installed handlers.
async fn stop_on(
    handlers: (
        std::io::Result<tokio::signal::unix::Signal>,
        std::io::Result<tokio::signal::unix::Signal>,
    ),
    server: ServerHandle,
) {
    let (Ok(mut term), Ok(mut int)) = handlers else {
        tracing::error!("cannot install the SIGTERM and SIGINT handlers; stop sekali with SIGKILL");
        return;
    };
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    tracing::info!(
        "{name} received: finishing the requests in flight, then stopping (send it again to stop at once)"
    );
    let graceful = actix_web::rt::spawn(server.stop(true));
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
        _ = graceful => return,
    }
    tracing::warn!(
        "second signal received: stopping at once, without waiting for requests in flight"
    );
    server.stop(false).await;
}

/// Connections the kernel queues while every worker is busy (actix's own default is 2,048).
const LISTEN_BACKLOG: i32 = 1024;

/// Binds a socket to the first of `address`'s addresses that it can, without listening yet,
/// trying the next one on any failure, as `TcpListener::bind` does.
fn reserve(address: &str) -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::net::ToSocketAddrs;
    let bind = |candidate: std::net::SocketAddr| {
        let socket = Socket::new(
            Domain::for_address(candidate),
            Type::STREAM,
            Some(Protocol::TCP),
        )?;
        // As std's TcpListener::bind does: a restart need not wait out TIME_WAIT.
        socket.set_reuse_address(true)?;
        socket.bind(&candidate.into())?;
        Ok::<_, std::io::Error>(socket)
    };
    let mut last_error = None;
    for candidate in address.to_socket_addrs()? {
        match bind(candidate) {
            Ok(socket) => return Ok(socket),
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address to listen on")
    }))
}

/// A built server: bound, with its writer and jobs started. Must be built and run inside an
/// actix runtime (`actix_web::rt::System`, or `#[actix_web::test]`).
pub struct Application {
    port: u16,
    server: Server,
    store: std::sync::Arc<dyn Store>,
    shutdown: CancellationToken,
    purge_job: actix_web::rt::task::JoinHandle<()>,
    refusals_log: actix_web::rt::task::JoinHandle<()>,
    relay: Option<std::thread::JoinHandle<()>>,
}

impl Application {
    pub fn build(settings: Settings, clock: SharedClock) -> Result<Self, StartupError> {
        settings.require_a_provider()?;
        warn_of_provider_settings(&settings);
        // The address is bound first, so a port another server listens on is refused before the
        // database file is created; connections are accepted only once everything is ready.
        // (Two servers starting at the same moment can both bind, as SO_REUSEADDR allows until
        // one listens; the second then fails at `listen`, after opening its database.)
        let bind_error = |source| StartupError::Bind {
            address: settings.listen.clone(),
            source,
        };
        let reserved = reserve(&settings.listen).map_err(bind_error)?;
        if let Some((relay, mail)) = &settings.relay {
            // Validated first: `check` creates the mail directory.
            relay.validate(mail.uses_http_api())?;
            mail.check()?;
        }

        let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(SqliteStore::open(
            WriterConfig {
                db_path: settings.db_path.clone(),
                batch_max: settings.batch_max,
                queue_capacity: settings.queue_capacity,
                busy_timeout: settings.busy_timeout,
                max_page_count: settings.max_page_count,
                reread_parked: Some(crate::providers::read_stored),
            },
            clock.clone(),
        )?);
        reserved.listen(LISTEN_BACKLOG).map_err(bind_error)?;
        let listener = TcpListener::from(reserved);
        let address = listener.local_addr().map_err(bind_error)?;

        let clock_for_relay = clock.clone();
        let refused = std::sync::Arc::new(routes::Refused::new(&settings.providers));
        let state = web::Data::new(AppState {
            providers: settings.providers.clone(),
            api_tokens: settings.api_tokens.clone(),
            max_body_bytes: settings.max_body_bytes,
            clock,
            store: store.clone(),
            idempotency_retention_secs: settings.idempotency_retention.as_secs() as i64,
            in_flight: Default::default(),
            refused: refused.clone(),
        });
        let mut server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .configure(routes::configure)
        })
        .shutdown_timeout(settings.shutdown_timeout.as_secs())
        .client_request_timeout(settings.client_request_timeout)
        .listen(listener)
        .map_err(bind_error)?;
        if settings.workers > 0 {
            server = server.workers(settings.workers);
        }
        // actix stops gracefully on SIGTERM but at once on SIGINT, dropping the answers of
        // requests in flight (whose events may be committed). sekali's own handler makes both
        // graceful; see `stop_on_signals`.
        let server = server.disable_signals().run();
        if settings.handle_signals {
            actix_web::rt::spawn(stop_on_signals(server.handle()));
        }

        let shutdown = CancellationToken::new();
        let refusals_log = actix_web::rt::spawn(report_refusals(refused, shutdown.clone()));
        let purge_job = actix_web::rt::spawn(run_purge_job(
            store.clone(),
            settings.purge_interval,
            settings.purge_batch,
            shutdown.clone(),
        ));
        let relay = settings.relay.clone().map(|(mut config, mail)| {
            config.db_path = settings.db_path.clone();
            crate::jobs::relay::spawn_relay(
                config,
                mail,
                clock_for_relay.clone(),
                shutdown.clone(),
                crate::jobs::relay::Queue::server(store.clone()),
            )
        });
        let webhook_urls: Vec<String> = settings
            .providers
            .iter()
            .map(|p| format!("/webhooks/{}", p.name()))
            .collect();
        let described: Vec<String> = settings
            .providers
            .iter()
            .filter_map(|p| {
                let text = p.describe();
                (!text.is_empty()).then(|| format!("{}: {text}", p.name()))
            })
            .collect();
        tracing::info!(
            %address,
            db = %settings.db_path.display(),
            webhooks = %webhook_urls.join(" "),
            providers = %described.join("; "),
            orders_api = !settings.api_tokens.is_empty(),
            relay = relay.is_some(),
            "sekali is listening; register https://<your host>{} with the provider{}",
            webhook_urls.join(" and https://<your host>"),
            if webhook_urls.len() > 1 { "s" } else { "" }
        );
        Ok(Application {
            port: address.port(),
            server,
            store,
            shutdown,
            purge_job,
            refusals_log,
            relay,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's store (tests read its counters, and run a relay through it as `serve`
    /// does).
    pub fn store(&self) -> std::sync::Arc<dyn Store> {
        self.store.clone()
    }

    /// Stops the server as SIGTERM would: `stop(true)` finishes in-flight requests first.
    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    /// Serves until stopped (SIGTERM, ctrl-c or [`ServerHandle::stop`]), then shuts down in
    /// order: in-flight requests finish (they are waiting on the writer, which still runs), the
    /// purge job stops, and the writer commits what is queued and exits.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let result = self.server.await;
        self.shutdown.cancel();
        let _ = self.refusals_log.await;
        let _ = self.purge_job.await;
        if let Some(relay) = self.relay {
            let _ = actix_web::rt::task::spawn_blocking(move || relay.join()).await;
        }
        let store = self.store;
        let _ = actix_web::rt::task::spawn_blocking(move || store.shutdown()).await;
        tracing::info!("sekali stopped");
        result
    }
}
