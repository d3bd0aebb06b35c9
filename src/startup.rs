//! Building and running the HTTP server.

use std::net::TcpListener;

use actix_web::dev::{Server, ServerHandle};
use actix_web::{web, App, HttpServer};
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::config::{ConfigError, Settings};
use crate::connections::ConnectionGauge;
use crate::jobs::purge::run_purge_job;
use crate::routes::{self, AppState};
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

/// The default sender, `sekali@localhost`, is no address a customer can answer, and receiving
/// servers refuse or file as spam mail from it: said at startup, as long as it is the sender.
fn warn_of_the_default_sender(mail: &crate::mail::transport::MailConfig) {
    if mail.from == crate::mail::transport::DEFAULT_MAIL_FROM {
        tracing::warn!(
            "the customer emails' sender is the default {}: set SEKALI_MAIL_FROM to the shop's \
             address (\"Toko Sari <orders@toko.example>\") before they go to real customers; \
             mail servers refuse or file as spam mail from it",
            crate::mail::transport::DEFAULT_MAIL_FROM
        );
    }
}

/// Logs the deliveries refused for a full write queue once a second, and the last ones when
/// the server stops (after its requests have finished); and a stretch at the connection limit
/// once, when it begins and when it ends.
async fn report_refusals(
    refused: std::sync::Arc<routes::Refused>,
    connections: std::sync::Arc<ConnectionGauge>,
    shutdown: CancellationToken,
) {
    let mut every_second = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = every_second.tick() => {
                refused.report();
                connections.report(std::time::Instant::now());
            }
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

/// Connections the kernel queues while every worker is busy, or the server holds all the
/// connections it takes (actix's own default is 2,048).
const LISTEN_BACKLOG: i32 = 1024;

/// The connections each worker takes (see [`crate::connections`]): what the open-file limit
/// leaves once the relay's mail batches (two can be open at once) and the reserve are set
/// aside, a delivery counted twice where a provider's API is asked before it is answered.
fn connection_limit(settings: &Settings, open_files: u64, workers: usize) -> usize {
    let mail_files = settings.relay.as_ref().map_or(0, |(relay, _)| {
        2 * (relay.batch as u64).min(crate::mail::eml::files_per_batch() as u64)
    });
    let outbound = settings
        .providers
        .iter()
        .map(|p| p.outbound_connections_per_delivery())
        .max()
        .unwrap_or(0);
    let per_worker =
        crate::connections::connection_limit(open_files, mail_files, 1 + outbound, workers);
    if per_worker == crate::connections::MIN_CONNECTIONS_PER_WORKER {
        tracing::warn!(
            open_files,
            "the open-file limit leaves room for few connections: each worker takes {per_worker}; \
             raise the limit (ulimit -n, LimitNOFILE=) for more"
        );
    }
    per_worker
}

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
    forwarder: Option<std::thread::JoinHandle<()>>,
    /// The server of `--metrics-listen`, stopped with the main one.
    metrics_server: Option<ServerHandle>,
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
            warn_of_the_default_sender(mail);
        }

        let store: std::sync::Arc<dyn Store> = crate::store::open(
            &settings.db,
            crate::store::Options {
                batch_max: settings.batch_max,
                queue_capacity: settings.queue_capacity,
                pg_writers: settings.pg_writers,
                busy_timeout: settings.busy_timeout,
                max_page_count: settings.max_page_count,
                reread: Some(crate::providers::read_stored),
                must_exist: false,
                commit_faults: Default::default(),
            },
            clock.clone(),
        )?;
        // Forwarding is on for the database while this instance is configured with it: every
        // change from now on is queued for the shop's endpoint, whichever instance or command
        // makes it.
        let forwarding = settings.forward.is_some();
        if crate::store::maintenance(&settings.db, true)?
            .set_forwarding(forwarding, clock.now_unix())?
        {
            if forwarding {
                tracing::info!("forwarding turned on: every order change from now on is queued for the shop's endpoint");
            } else {
                tracing::warn!("forwarding turned off (SEKALI_FORWARD_URL is not set): order changes from now on are not queued for the shop's endpoint; changes already queued wait until it is set again");
            }
        }
        reserved.listen(LISTEN_BACKLOG).map_err(bind_error)?;
        let listener = TcpListener::from(reserved);
        let address = listener.local_addr().map_err(bind_error)?;

        let clock_for_relay = clock.clone();
        let refused = std::sync::Arc::new(routes::Refused::new(&settings.providers));
        let metrics = std::sync::Arc::new(crate::metrics::Metrics::new(
            &settings.providers,
            store.clone(),
        ));
        let clock_for_metrics = clock.clone();
        let state = web::Data::new(AppState {
            providers: settings.providers.clone(),
            api_tokens: settings.api_tokens.clone(),
            max_body_bytes: settings.max_body_bytes,
            body_timeout: settings.body_timeout,
            clock,
            store: store.clone(),
            idempotency_retention_secs: settings.idempotency_retention.as_secs() as i64,
            in_flight: Default::default(),
            refused: refused.clone(),
            metrics: metrics.clone(),
            serves_metrics: settings.metrics_listen.is_none(),
            console_tokens: settings.console_tokens.clone(),
            db: settings.db.clone(),
            health_probe: Default::default(),
            login_throttle: Default::default(),
        });
        let workers = match settings.workers {
            0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            n => n,
        };
        let open_files = crate::open_files::soft_limit();
        let per_worker = connection_limit(&settings, open_files, workers);
        let gauge = ConnectionGauge::new(per_worker * workers, open_files);
        let connections = gauge.clone();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .configure(routes::configure)
        })
        .workers(workers)
        .max_connections(per_worker)
        .on_connect(move |_, extensions| {
            extensions.insert(connections.opened());
        })
        .shutdown_timeout(settings.shutdown_timeout.as_secs())
        .client_request_timeout(settings.client_request_timeout)
        .listen(listener)
        .map_err(bind_error)?;
        // actix stops gracefully on SIGTERM but at once on SIGINT, dropping the answers of
        // requests in flight (whose events may be committed). sekali's own handler makes both
        // graceful; see `stop_on_signals`.
        let server = server.disable_signals().run();
        if settings.handle_signals {
            actix_web::rt::spawn(stop_on_signals(server.handle()));
        }
        // `/metrics` on an address of its own: one worker, the same state, nothing else served.
        let metrics_server = match &settings.metrics_listen {
            Some(address) => {
                let metrics_state = web::Data::new(AppState {
                    providers: settings.providers.clone(),
                    api_tokens: Vec::new(),
                    max_body_bytes: settings.max_body_bytes,
                    body_timeout: settings.body_timeout,
                    clock: clock_for_metrics,
                    store: store.clone(),
                    idempotency_retention_secs: 0,
                    in_flight: Default::default(),
                    refused: refused.clone(),
                    metrics: metrics.clone(),
                    serves_metrics: true,
                    console_tokens: Vec::new(),
                    db: settings.db.clone(),
                    health_probe: Default::default(),
                    login_throttle: Default::default(),
                });
                let bound = HttpServer::new(move || {
                    App::new()
                        .app_data(metrics_state.clone())
                        .configure(routes::metrics::configure_alone)
                })
                .workers(1)
                .disable_signals()
                .bind(address.as_str())
                .map_err(|source| StartupError::Bind {
                    address: address.clone(),
                    source,
                })?;
                let addresses = bound.addrs();
                let running = bound.run();
                let handle = running.handle();
                actix_web::rt::spawn(running);
                tracing::info!(address = ?addresses, "GET /metrics served on its own address, not on --listen's");
                Some(handle)
            }
            None => None,
        };

        let shutdown = CancellationToken::new();
        let refusals_log =
            actix_web::rt::spawn(report_refusals(refused, gauge.clone(), shutdown.clone()));
        let purge_job = actix_web::rt::spawn(run_purge_job(
            store.clone(),
            settings.purge_interval,
            settings.purge_batch,
            shutdown.clone(),
            metrics.clone(),
        ));
        let relay = settings.relay.clone().map(|(mut config, mail)| {
            config.db = settings.db.clone();
            crate::jobs::relay::spawn_relay(
                config,
                mail,
                clock_for_relay.clone(),
                shutdown.clone(),
                crate::jobs::relay::Queue::server(store.clone()).with_metrics(metrics.clone()),
            )
        });
        let forwarder = match (&settings.forward, &settings.relay) {
            (Some(forward), Some((config, _))) if settings.forward_sends => {
                let mut config = config.clone();
                config.owner = format!("{}:forward", config.owner);
                Some(crate::jobs::forward::spawn_forwarder(
                    config,
                    forward.clone(),
                    clock_for_relay.clone(),
                    shutdown.clone(),
                    store.clone(),
                    Some(metrics.clone()),
                ))
            }
            (Some(_), _) => {
                tracing::warn!("forwarding is on, but this instance does not send (--no-relay): order changes are queued for an instance started without --no-relay (`sekali relay` sends emails only)");
                None
            }
            _ => None,
        };
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
            db = %settings.db,
            webhooks = %webhook_urls.join(" "),
            // Absent, not `providers=` with nothing after it, when no provider has a word to say.
            providers = (!described.is_empty()).then(|| tracing::field::display(described.join("; "))),
            orders_api = !settings.api_tokens.is_empty(),
            console = !settings.console_tokens.is_empty(),
            relay = relay.is_some(),
            forwarding = forwarder.is_some(),
            max_connections = gauge.limit(),
            // PostgreSQL only (SQLite has one writer).
            pg_writers = matches!(settings.db, crate::store::Location::Server(_))
                .then_some(settings.pg_writers),
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
            forwarder,
            metrics_server,
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
        if let Some(metrics_server) = self.metrics_server {
            metrics_server.stop(true).await;
        }
        self.shutdown.cancel();
        let _ = self.refusals_log.await;
        let _ = self.purge_job.await;
        if let Some(relay) = self.relay {
            let _ = actix_web::rt::task::spawn_blocking(move || relay.join()).await;
        }
        if let Some(forwarder) = self.forwarder {
            let _ = actix_web::rt::task::spawn_blocking(move || forwarder.join()).await;
        }
        let store = self.store;
        let _ = actix_web::rt::task::spawn_blocking(move || store.shutdown()).await;
        tracing::info!("sekali stopped");
        result
    }
}
