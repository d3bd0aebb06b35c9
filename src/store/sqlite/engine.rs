//! The SQLite engine behind the store's interfaces: [`SqliteStore`] for the server (the single
//! writer and a read pool) and [`SqliteMaintenance`] for a command (one connection).

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::future::BoxFuture;
use rusqlite::Connection;

use super::writer::{Writer, WriterConfig};
use super::{backup, console, forward, orders, outbox, purge, reads, runs, ReadPool, StoreError};
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

/// Read-only connections the server keeps for `/healthz` and the orders API's reads.
const READ_POOL_SIZE: u32 = 4;

/// The server's SQLite store: every write goes through the one writer thread, every read
/// through a pool of read-only connections.
#[derive(Clone)]
pub struct SqliteStore {
    writer: Writer,
    reads: ReadPool,
}

impl SqliteStore {
    /// Opens the database at `config.db_path` (creating it and applying the schema) and starts
    /// the writer.
    pub fn open(config: WriterConfig, clock: SharedClock) -> Result<Self, StoreError> {
        let busy_timeout = config.busy_timeout;
        let path = config.db_path.clone();
        let writer = Writer::start(config, clock)?;
        let reads = super::read_pool(&path, READ_POOL_SIZE, busy_timeout)?;
        Ok(SqliteStore { writer, reads })
    }

    /// Like [`SqliteStore::open`], for a database that must exist already (`sekali relay`): a
    /// missing file is an error rather than a new empty database.
    pub fn open_existing(config: WriterConfig, clock: SharedClock) -> Result<Self, StoreError> {
        if !config.db_path.exists() {
            return Err(StoreError::Missing(config.db_path.display().to_string()));
        }
        Self::open(config, clock)
    }

    /// Runs a read on a pooled read-only connection, off the async executor.
    fn read<T: Send + 'static>(
        &self,
        query: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let pool = self.reads.clone();
        Box::pin(async move {
            actix_web::rt::task::spawn_blocking(move || Ok(query(&*pool.get()?)?))
                .await
                .map_err(|e| StoreError::Blocking(e.to_string()))?
        })
    }
}

impl Store for SqliteStore {
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
        self.read(move |conn| orders::get_order(conn, &order_id))
    }

    fn orders(&self, query: OrderQuery) -> BoxFuture<'_, Result<Vec<OrderView>, StoreError>> {
        self.read(move |conn| {
            orders::list_orders(
                conn,
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
        self.read(move |conn| orders::changes(conn, after, limit))
    }

    fn outbox_backlog(
        &self,
        now_ms: i64,
    ) -> BoxFuture<'_, Result<[(OutboxKind, OutboxBacklog); 2], StoreError>> {
        self.read(move |conn| reads::outbox_backlog(conn, now_ms))
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

/// One connection to an existing database, for an operator's command.
pub struct SqliteMaintenance {
    path: PathBuf,
    conn: Connection,
    busy_timeout: Duration,
}

impl SqliteMaintenance {
    /// Opens the database at `path`, which must exist; `writable` brings its schema up to date.
    pub fn open(path: &Path, writable: bool) -> Result<Self, StoreError> {
        let busy_timeout = super::DEFAULT_BUSY_TIMEOUT;
        Ok(SqliteMaintenance {
            path: path.to_owned(),
            conn: super::open_existing(path, writable, busy_timeout)?,
            busy_timeout,
        })
    }
}

impl Maintenance for SqliteMaintenance {
    fn events(&self, query: &EventQuery) -> Result<Vec<EventSummary>, StoreError> {
        Ok(reads::list_events(&self.conn, query)?)
    }

    fn find_events(
        &self,
        event_id: &str,
        provider: Option<&str>,
    ) -> Result<Vec<EventDetail>, StoreError> {
        Ok(reads::find_events(&self.conn, event_id, provider)?)
    }

    fn order(&self, order_id: &str) -> Result<Option<OrderView>, StoreError> {
        Ok(orders::get_order(&self.conn, order_id)?)
    }

    fn transitions(&self, order_id: &str) -> Result<Vec<Transition>, StoreError> {
        Ok(orders::transitions(&self.conn, order_id)?)
    }

    fn outbox(&self, query: &OutboxQuery) -> Result<Vec<OutboxRow>, StoreError> {
        Ok(outbox::list(&self.conn, query)?)
    }

    fn outbox_row(&self, id: i64) -> Result<Option<OutboxRow>, StoreError> {
        Ok(outbox::get(&self.conn, id)?)
    }

    fn retry(&self, id: i64, now_ms: i64) -> Result<Retried, StoreError> {
        outbox::retry(&self.conn, OutboxKind::Email, id, now_ms)
    }

    fn skip_email(&self, id: i64, now_ms: i64) -> Result<Skipped, StoreError> {
        outbox::skip(&self.conn, OutboxKind::Email, id, now_ms)
    }

    fn outbox_attempts(
        &self,
        outbox: OutboxKind,
        row_id: i64,
    ) -> Result<Vec<crate::store::OutboxAttempt>, StoreError> {
        Ok(reads::outbox_attempts(&self.conn, outbox, row_id)?)
    }

    fn end_console_session(
        &self,
        session: &str,
        expires_unix: i64,
        now_unix: i64,
    ) -> Result<(), StoreError> {
        console::end_session(&self.conn, session, expires_unix, now_unix)
    }

    fn console_session_ended(&self, session: &str) -> Result<bool, StoreError> {
        Ok(console::session_ended(&self.conn, session)?)
    }

    fn event_counts(&self, since_unix: i64) -> Result<Vec<EventCount>, StoreError> {
        Ok(reads::event_counts(&self.conn, since_unix)?)
    }

    fn forwards(&self, query: &OutboxQuery) -> Result<Vec<ForwardRow>, StoreError> {
        Ok(forward::list(&self.conn, query)?)
    }

    fn forward_row(&self, id: i64) -> Result<Option<(ForwardRow, String)>, StoreError> {
        Ok(forward::get(&self.conn, id)?)
    }

    fn retry_forward(&self, id: i64, now_ms: i64) -> Result<Retried, StoreError> {
        outbox::retry(&self.conn, OutboxKind::Forward, id, now_ms)
    }

    fn skip_forward(&self, id: i64, now_ms: i64) -> Result<Skipped, StoreError> {
        outbox::skip(&self.conn, OutboxKind::Forward, id, now_ms)
    }

    fn set_forwarding(&self, on: bool, now_unix: i64) -> Result<bool, StoreError> {
        forward::set_forwarding(&self.conn, on, now_unix)
    }

    fn set_status_by_operator(
        &self,
        order_id: &str,
        change: &OperatorChange,
        now_unix: i64,
    ) -> Result<OrderStatus, SetStatusError> {
        orders::set_status_by_operator(&self.conn, order_id, change, now_unix)
    }

    fn purge_all_expired(&self, now_unix: i64, batch: usize) -> Result<Purged, StoreError> {
        purge::purge_all_expired(&self.conn, now_unix, batch)
    }

    fn backup(&self, out: &Path) -> Result<BackupReport, StoreError> {
        backup::backup_database(&self.path, out, self.busy_timeout)
    }

    fn export(
        &self,
        visit: &mut (dyn FnMut(usize, &[crate::store::copy::Cell]) -> Result<(), StoreError>
                  + Send),
    ) -> Result<(), StoreError> {
        super::copy::export(&self.conn, visit)
    }

    fn run_counts(&self, marker: &str) -> Result<RunCounts, StoreError> {
        Ok(reads::run_counts(&self.conn, marker)?)
    }

    fn orders_outside_runs(&self, examples: u32) -> Result<OrdersOutsideRuns, StoreError> {
        Ok(runs::orders_outside_runs(&self.conn, examples)?)
    }

    fn delete_run(&self, run: &RunMarker, now_ms: i64) -> Result<RunDeletion, StoreError> {
        runs::delete_run(&self.conn, run, now_ms)
    }
}
