//! The PostgreSQL engine behind the store's interfaces: [`PgStore`] for the server (the
//! instance's writer and a read pool) and [`PgMaintenance`] for a command (one connection).

use std::path::Path;
use std::sync::Mutex;

use futures_util::future::BoxFuture;
use postgres::Client;
use r2d2_postgres::PostgresConnectionManager;

use super::writer::{Writer, WriterConfig};
use super::{
    forward, orders, outbox, purge, reads, runs, schema, Db, Statements, StoreError, Target,
};
use crate::clock::SharedClock;
use crate::domain::{NormalizedEvent, OrderStatus};
use crate::store::model::{
    BackupReport, ClaimRequest, Claimed, EventCount, EventDetail, EventQuery, EventSummary,
    IdempotentOutcome, OperatorChange, OrderView, OrdersOutsideRuns, OutboxQuery, OutboxRow,
    Purged, Retried, RunCounts, RunDeletion, RunMarker, SendResult, SetStatusError, StoreStats,
    Transition,
};
use crate::store::{
    Change, ChangeCursor, CreateOrder, ForwardRow, Maintenance, OrderQuery, OutboxBacklog,
    OutboxKind, Outcome, Skipped, Store, WriteError,
};

/// Connections an instance keeps for `/healthz` and the orders API's reads.
const READ_POOL_SIZE: u32 = 4;

type Pool = r2d2::Pool<PostgresConnectionManager<super::connect::Tls>>;

/// The read pool. Its idle connections close when it is dropped, which blocks: on a thread of
/// its own, since the last handle may go on an async task.
struct ReadPool(Option<Pool>);

impl Drop for ReadPool {
    fn drop(&mut self) {
        let pool = self.0.take();
        let _ = std::thread::spawn(move || drop(pool)).join();
    }
}

/// One instance's store on a PostgreSQL database that other instances may share.
#[derive(Clone)]
pub struct PgStore {
    writer: Writer,
    reads: std::sync::Arc<ReadPool>,
}

impl PgStore {
    /// Connects, brings the schema up to date (several instances starting at once take turns),
    /// and starts the writer. Blocking, and callable from anywhere: the connecting runs on a
    /// thread of its own (`serve` opens its store inside its runtime).
    pub fn open(config: WriterConfig, clock: SharedClock) -> Result<Self, StoreError> {
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    schema::migrate(&mut config.target.connect()?)?;
                    let reads = r2d2::Pool::builder()
                        .max_size(READ_POOL_SIZE)
                        .min_idle(Some(0))
                        .connection_timeout(std::time::Duration::from_secs(5))
                        .build_unchecked(PostgresConnectionManager::new(
                            config.target.config().clone(),
                            config.target.tls(),
                        ));
                    let writer = Writer::start(config, clock)?;
                    Ok(PgStore {
                        writer,
                        reads: std::sync::Arc::new(ReadPool(Some(reads))),
                    })
                })
                .join()
                .expect("the connecting thread panicked")
        })
    }

    /// Runs a read in a transaction on a pooled connection, off the async executor.
    fn read<T: Send + 'static>(
        &self,
        query: impl FnOnce(&mut Db<'_, '_>) -> Result<T, StoreError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        self.on_pooled(move |client| in_transaction(client, query))
    }

    /// Runs `work` on a pooled connection, off the async executor.
    fn on_pooled<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Client) -> Result<T, StoreError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let pool = self.reads.clone();
        Box::pin(async move {
            actix_web::rt::task::spawn_blocking(move || {
                let mut client = pool
                    .0
                    .as_ref()
                    .expect("the pool lives until dropped")
                    .get()?;
                work(&mut client)
            })
            .await
            .map_err(|e| StoreError::Blocking(e.to_string()))?
        })
    }
}

/// Runs `work` in a transaction of its own on `client`, committed when it returns `Ok` and
/// rolled back when it returns an error.
fn in_transaction<T, E: From<StoreError>>(
    client: &mut Client,
    work: impl FnOnce(&mut Db<'_, '_>) -> Result<T, E>,
) -> Result<T, E> {
    let mut statements = Statements::default();
    let mut tx = client.transaction().map_err(StoreError::from)?;
    let value = work(&mut Db::new(&mut tx, &mut statements))?;
    tx.commit().map_err(StoreError::from)?;
    Ok(value)
}

impl Store for PgStore {
    fn record(
        &self,
        event: NormalizedEvent,
        payload: String,
    ) -> BoxFuture<'_, Result<Outcome, WriteError>> {
        Box::pin(self.writer.record(event, payload))
    }

    fn create_order(
        &self,
        request: CreateOrder,
    ) -> BoxFuture<'_, Result<IdempotentOutcome, WriteError>> {
        Box::pin(self.writer.idempotent(request))
    }

    fn claim(&self, request: ClaimRequest) -> BoxFuture<'_, Result<Claimed, WriteError>> {
        Box::pin(self.writer.claim_outbox(request))
    }

    fn record_results(
        &self,
        outbox: OutboxKind,
        owner: String,
        results: Vec<SendResult>,
    ) -> BoxFuture<'_, Result<Vec<bool>, WriteError>> {
        Box::pin(self.writer.record_outbox_results(owner, results, outbox))
    }

    fn purge_batch(&self, limit: usize) -> BoxFuture<'_, Result<Purged, WriteError>> {
        Box::pin(self.writer.purge_batch(limit))
    }

    fn order(&self, order_id: String) -> BoxFuture<'_, Result<Option<OrderView>, StoreError>> {
        self.read(move |db| orders::get_order(db, &order_id))
    }

    fn orders(&self, query: OrderQuery) -> BoxFuture<'_, Result<Vec<OrderView>, StoreError>> {
        self.read(move |db| {
            orders::list_orders(
                db,
                query.status.map(OrderStatus::as_str),
                query.after.as_deref(),
                query.limit,
            )
        })
    }

    fn changes(
        &self,
        after: Option<ChangeCursor>,
        limit: u32,
    ) -> BoxFuture<'_, Result<Vec<Change>, StoreError>> {
        self.on_pooled(move |client| {
            // Committed first, so that the page's snapshot sees the places it gave.
            in_transaction(client, orders::publish_changes)?;
            in_transaction(client, |db| orders::changes(db, after, limit))
        })
    }

    fn outbox_backlog(
        &self,
        now_ms: i64,
    ) -> BoxFuture<'_, Result<[(OutboxKind, OutboxBacklog); 2], StoreError>> {
        self.read(move |db| reads::outbox_backlog(db, now_ms))
    }

    fn check_health(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        self.read(reads::check_health)
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            writer: self.writer.stats(),
        }
    }

    fn writer_histograms(&self) -> crate::store::counters::WriterHistograms {
        self.writer.histograms()
    }

    fn shutdown(&self) {
        self.writer.shutdown();
    }
}

/// One connection to the database, for an operator's command. The driver's client runs on a
/// runtime of its own and must not be called from an async task: each call runs on a thread of
/// its own, so a command may be called from anywhere (the tests call it inside their runtime).
pub struct PgMaintenance {
    /// Always `Some` until it is dropped (on a thread of its own: closing the connection
    /// blocks too).
    client: Mutex<Option<Client>>,
}

impl Drop for PgMaintenance {
    fn drop(&mut self) {
        let client = self.client.get_mut().map(Option::take).unwrap_or(None);
        let _ = std::thread::spawn(move || drop(client)).join();
    }
}

impl PgMaintenance {
    /// Connects to `target`; `writable` brings its schema up to date, as `serve` would.
    pub fn open(target: &Target, writable: bool) -> Result<Self, StoreError> {
        let target = target.clone();
        let client = std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    let mut client = target.connect()?;
                    if writable {
                        schema::migrate(&mut client)?;
                    } else if !schema::has_tables(&mut client)? {
                        return Err(StoreError::NoTables(target.to_string()));
                    }
                    Ok::<_, StoreError>(client)
                })
                .join()
                .expect("the connecting thread panicked")
        })?;
        Ok(PgMaintenance {
            client: Mutex::new(Some(client)),
        })
    }

    /// Runs `work` in one transaction, on a thread of its own.
    fn run<T: Send, E: From<StoreError> + Send>(
        &self,
        work: impl FnOnce(&mut Db<'_, '_>) -> Result<T, E> + Send,
    ) -> Result<T, E> {
        let mut guard = self.client.lock().expect("maintenance connection lock");
        let client: &mut Client = guard
            .as_mut()
            .expect("the connection is open until dropped");
        std::thread::scope(|scope| {
            scope
                .spawn(|| in_transaction(client, work))
                .join()
                .expect("a maintenance thread panicked")
        })
    }
}

impl Maintenance for PgMaintenance {
    fn events(&self, query: &EventQuery) -> Result<Vec<EventSummary>, StoreError> {
        self.run(|db| reads::list_events(db, query))
    }

    fn find_events(
        &self,
        event_id: &str,
        provider: Option<&str>,
    ) -> Result<Vec<EventDetail>, StoreError> {
        self.run(|db| reads::find_events(db, event_id, provider))
    }

    fn order(&self, order_id: &str) -> Result<Option<OrderView>, StoreError> {
        self.run(|db| orders::get_order(db, order_id))
    }

    fn transitions(&self, order_id: &str) -> Result<Vec<Transition>, StoreError> {
        self.run(|db| orders::transitions(db, order_id))
    }

    fn outbox(&self, query: &OutboxQuery) -> Result<Vec<OutboxRow>, StoreError> {
        self.run(|db| outbox::list(db, query))
    }

    fn outbox_row(&self, id: i64) -> Result<Option<OutboxRow>, StoreError> {
        self.run(|db| outbox::get(db, id))
    }

    fn retry(&self, id: i64, now_ms: i64) -> Result<Retried, StoreError> {
        self.run(|db| outbox::retry(db, OutboxKind::Email, id, now_ms))
    }

    fn skip_email(&self, id: i64, now_ms: i64) -> Result<Skipped, StoreError> {
        self.run(|db| outbox::skip(db, OutboxKind::Email, id, now_ms))
    }

    fn outbox_attempts(
        &self,
        outbox: OutboxKind,
        row_id: i64,
    ) -> Result<Vec<crate::store::OutboxAttempt>, StoreError> {
        self.run(|db| reads::outbox_attempts(db, outbox, row_id))
    }

    fn end_console_session(
        &self,
        session: &str,
        expires_unix: i64,
        now_unix: i64,
    ) -> Result<(), StoreError> {
        self.run(|db| super::console::end_session(db, session, expires_unix, now_unix))
    }

    fn console_session_ended(&self, session: &str) -> Result<bool, StoreError> {
        self.run(|db| super::console::session_ended(db, session))
    }

    fn event_counts(&self, since_unix: i64) -> Result<Vec<EventCount>, StoreError> {
        self.run(|db| reads::event_counts(db, since_unix))
    }

    fn forwards(&self, query: &OutboxQuery) -> Result<Vec<ForwardRow>, StoreError> {
        self.run(|db| forward::list(db, query))
    }

    fn forward_row(&self, id: i64) -> Result<Option<(ForwardRow, String)>, StoreError> {
        self.run(|db| forward::get_row(db, id))
    }

    fn retry_forward(&self, id: i64, now_ms: i64) -> Result<Retried, StoreError> {
        self.run(|db| outbox::retry(db, OutboxKind::Forward, id, now_ms))
    }

    fn skip_forward(&self, id: i64, now_ms: i64) -> Result<Skipped, StoreError> {
        self.run(|db| outbox::skip(db, OutboxKind::Forward, id, now_ms))
    }

    fn set_forwarding(&self, on: bool, now_unix: i64) -> Result<bool, StoreError> {
        self.run(|db| forward::set_forwarding(db, on, now_unix))
    }

    fn set_status_by_operator(
        &self,
        order_id: &str,
        change: &OperatorChange,
        now_unix: i64,
    ) -> Result<OrderStatus, SetStatusError> {
        self.run(|db| orders::set_status_by_operator(db, order_id, change, now_unix))
    }

    fn purge_all_expired(&self, now_unix: i64, batch: usize) -> Result<Purged, StoreError> {
        let mut total = Purged::default();
        loop {
            let purged = self.run(|db| purge::purge_batch(db, now_unix, batch))?;
            total += purged;
            if !purged.was_full(batch) {
                return Ok(total);
            }
        }
    }

    /// A copy into a new SQLite file (see [`crate::store::copy::backup_to_file`]): one
    /// consistent snapshot, which `sekali --db FILE` and `sqlite3` open, and `sekali copy`
    /// moves back into a PostgreSQL database.
    fn backup(&self, out: &Path) -> Result<BackupReport, StoreError> {
        crate::store::copy::backup_to_file(self, out)
    }

    fn export(
        &self,
        visit: &mut (dyn FnMut(usize, &[crate::store::copy::Cell]) -> Result<(), StoreError>
                  + Send),
    ) -> Result<(), StoreError> {
        let mut guard = self.client.lock().expect("maintenance connection lock");
        let client: &mut Client = guard
            .as_mut()
            .expect("the connection is open until dropped");
        std::thread::scope(|scope| {
            scope
                .spawn(|| super::copy::export(client, visit))
                .join()
                .expect("a maintenance thread panicked")
        })
    }

    fn run_counts(&self, marker: &str) -> Result<RunCounts, StoreError> {
        self.run(|db| reads::run_counts(db, marker))
    }

    fn orders_outside_runs(&self, examples: u32) -> Result<OrdersOutsideRuns, StoreError> {
        self.run(|db| runs::orders_outside_runs(db, examples))
    }

    fn delete_run(&self, run: &RunMarker, now_ms: i64) -> Result<RunDeletion, StoreError> {
        self.run(|db| runs::delete_run(db, run, now_ms))
    }
}
