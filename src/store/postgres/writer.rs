//! The writer of one sekali instance on PostgreSQL: one thread, one connection, and whatever is
//! queued committed in one transaction (group commit), each unit of work in a savepoint of its
//! own so that one failure is rolled back alone.
//!
//! Several instances write the same database, each with its own writer. A batch takes its locks
//! in key order (deliveries sorted by the order or payment they name, then by event id), so two
//! instances' batches wait for each other rather than deadlock; when they do deadlock anyway
//! (40P01), or a serialization failure (40001) ends a statement, the unit reruns in a fresh
//! savepoint, up to [`TRANSIENT_RERUNS`] times. A lost connection (a restart, a failover) fails
//! the batch with 503, which every provider retries, and the writer connects again before its
//! next batch: through a multi-host URL, to whichever host is the primary now.

use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use postgres::Client;
use tokio::sync::oneshot;
use tracing::Span;

use super::{events, idempotency, outbox, purge, Db, Statements, StoreError, Target};
use crate::clock::SharedClock;
use crate::domain::{NormalizedEvent, OrderRef, Outcome};
use crate::store::counters::{Done, Reply, WriterCounters};
use crate::store::model::{
    ClaimRequest, Claimed, IdempotentOutcome, OutboxKind, Purged, SendResult, WriterStats,
};
use crate::store::{CommitFaults, CreateOrder, ErrorKind, WriteError};

/// Times a unit reruns after a deadlock or a serialization failure before it gets 503.
pub const TRANSIENT_RERUNS: u32 = 3;

/// Writers per instance by default (`serve --pg-writers`). A writer spends much of a batch
/// waiting for the server's answers (one round trip per statement): two, each committing its own
/// batches, keep the server busy while each waits. More make each batch smaller, and a batch's
/// deliveries that go together cost a few statements whatever their number
/// (`events::apply_claimed_together`): with them, 2 writers did 1.19 × 4 and 1.24 × 1, and two
/// instances did better with one writer each than with two (docs/postgres.md#performance).
pub const DEFAULT_WRITERS: usize = 2;

/// How long the writer waits between attempts to connect again.
const RECONNECT_PAUSE: Duration = Duration::from_millis(250);

#[derive(Debug, Clone)]
pub struct WriterConfig {
    pub target: Target,
    /// Writer threads, each with a connection of its own, taking batches from one queue (see
    /// [`DEFAULT_WRITERS`]).
    pub writers: usize,
    /// Most units of work committed by one transaction.
    pub batch_max: usize,
    /// Units waiting for the writer before new deliveries get 503.
    pub queue_capacity: usize,
    /// Commits to fail on purpose (the conformance suite's "fail the next commit").
    pub commit_faults: CommitFaults,
}

// A delivery carries its event inline: every `Work` travels boxed in its `Job` already.
#[allow(clippy::large_enum_variant)]
enum Work {
    Delivery {
        event: NormalizedEvent,
        payload: String,
        reply: Reply<Outcome>,
    },
    Idempotent {
        request: CreateOrder,
        reply: Reply<IdempotentOutcome>,
    },
    OutboxClaim {
        request: ClaimRequest,
        reply: Reply<Claimed>,
    },
    OutboxResults {
        owner: String,
        results: Vec<SendResult>,
        outbox: OutboxKind,
        reply: Reply<Vec<bool>>,
    },
}

enum Job {
    Work(Box<(Work, Span)>),
    PurgeBatch { limit: usize, reply: Reply<Purged> },
    Shutdown,
}

/// A handle to the writer threads; cheap to clone.
#[derive(Clone)]
pub struct Writer {
    queue: SyncSender<Job>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    counters: Arc<WriterCounters>,
}

impl Writer {
    /// Connects (so that a wrong URL or password fails startup, not the first delivery) and
    /// starts the writer thread. The schema must be in place.
    pub fn start(mut config: WriterConfig, clock: SharedClock) -> Result<Self, StoreError> {
        config.target = config.target.named("sekali writer");
        let counters = Arc::new(WriterCounters::default());
        let clients = (0..config.writers.max(1))
            .map(|_| config.target.connect())
            .collect::<Result<Vec<_>, _>>()?;
        WriterCounters::add(&counters.connections_opened, clients.len());
        let (queue, jobs) = mpsc::sync_channel(config.queue_capacity.max(1));
        let jobs = Arc::new(Mutex::new(jobs));
        let threads = clients
            .into_iter()
            .enumerate()
            .map(|(n, client)| {
                let (jobs, config, clock, counters) = (
                    jobs.clone(),
                    config.clone(),
                    clock.clone(),
                    counters.clone(),
                );
                std::thread::Builder::new()
                    .name(format!("sekali-pg-writer-{n}"))
                    .spawn(move || run(client, &jobs, config, clock, &counters))
                    .expect("spawning a writer thread")
            })
            .collect();
        Ok(Writer {
            queue,
            threads: Arc::new(Mutex::new(threads)),
            counters,
        })
    }

    pub fn stats(&self) -> WriterStats {
        self.counters.read()
    }

    pub fn histograms(&self) -> crate::store::counters::WriterHistograms {
        self.counters.histograms()
    }

    async fn submit<T>(&self, work: impl FnOnce(Reply<T>) -> Work) -> Result<T, WriteError> {
        let (reply, answer) = oneshot::channel();
        let job = Job::Work(Box::new((work(reply), Span::current())));
        self.queue.try_send(job).map_err(|e| match e {
            TrySendError::Full(_) => WriteError::QueueFull,
            TrySendError::Disconnected(_) => WriteError::WriterGone,
        })?;
        self.counters.queue(1);
        answer.await.unwrap_or(Err(WriteError::WriterGone))
    }

    pub async fn record(
        &self,
        event: NormalizedEvent,
        payload: String,
    ) -> Result<Outcome, WriteError> {
        self.submit(|reply| Work::Delivery {
            event,
            payload,
            reply,
        })
        .await
    }

    pub async fn idempotent(&self, request: CreateOrder) -> Result<IdempotentOutcome, WriteError> {
        self.submit(|reply| Work::Idempotent { request, reply })
            .await
    }

    pub async fn claim_outbox(&self, request: ClaimRequest) -> Result<Claimed, WriteError> {
        self.submit(|reply| Work::OutboxClaim { request, reply })
            .await
    }

    pub async fn record_outbox_results(
        &self,
        owner: String,
        results: Vec<SendResult>,
        outbox: OutboxKind,
    ) -> Result<Vec<bool>, WriteError> {
        self.submit(|reply| Work::OutboxResults {
            owner,
            results,
            outbox,
            reply,
        })
        .await
    }

    pub async fn purge_batch(&self, limit: usize) -> Result<Purged, WriteError> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .try_send(Job::PurgeBatch { limit, reply })
            .map_err(|e| match e {
                TrySendError::Full(_) => WriteError::QueueFull,
                TrySendError::Disconnected(_) => WriteError::WriterGone,
            })?;
        self.counters.queue(1);
        answer.await.unwrap_or(Err(WriteError::WriterGone))
    }

    /// Lets the writer finish everything already queued, then stops it and waits. Blocking.
    pub fn shutdown(&self) {
        let threads = std::mem::take(&mut *self.threads.lock().expect("writer threads lock"));
        // One stop for each writer: a writer takes one and ends.
        for _ in &threads {
            if self.queue.send(Job::Shutdown).is_ok() {
                self.counters.queue(1);
            }
        }
        for thread in threads {
            let _ = thread.join();
        }
    }
}

/// The writer's connection, or none while the database cannot be reached.
struct Connection {
    client: Option<Client>,
    statements: Statements,
}

impl Connection {
    /// The connection, connecting again first if the last one was lost. `None` (and an error
    /// logged) while the database cannot be reached: the batch gets 503.
    fn get(
        &mut self,
        target: &Target,
        counters: &WriterCounters,
    ) -> Option<(&mut Client, &mut Statements)> {
        if self.client.as_ref().is_some_and(|c| c.is_closed()) {
            self.client = None;
        }
        if self.client.is_none() {
            self.statements.clear();
            match target.connect() {
                Ok(client) => {
                    WriterCounters::add(&counters.connections_opened, 1);
                    WriterCounters::add(&counters.reopens, 1);
                    tracing::info!(database = %target, "the writer connected again");
                    self.client = Some(client);
                }
                Err(e) => {
                    tracing::error!(error = %crate::telemetry::ErrorChain(&e), "the writer cannot connect to the database; answering 503 until it can");
                    std::thread::sleep(RECONNECT_PAUSE);
                    return None;
                }
            }
        }
        self.client.as_mut().map(|c| (c, &mut self.statements))
    }

    fn lose(&mut self) {
        self.client = None;
        self.statements.clear();
    }
}

fn run(
    client: Client,
    jobs: &Mutex<Receiver<Job>>,
    config: WriterConfig,
    clock: SharedClock,
    counters: &WriterCounters,
) {
    let mut conn = Connection {
        client: Some(client),
        statements: Statements::default(),
    };
    let batch_max = config.batch_max.max(1);
    let mut shutting_down = false;
    while !shutting_down {
        let mut batch = Vec::with_capacity(batch_max);
        let mut purges = Vec::new();
        {
            // One writer takes what is queued, up to a batch; the others wait their turn.
            let jobs = jobs.lock().expect("the writers' queue lock");
            let Ok(first) = jobs.recv() else { break };
            let mut next = Some(first);
            while let Some(job) = next.take() {
                counters.queue(-1);
                match job {
                    Job::Work(work) => batch.push(*work),
                    Job::PurgeBatch { limit, reply } => purges.push((limit, reply)),
                    Job::Shutdown => shutting_down = true,
                }
                if batch.len() < batch_max && !shutting_down {
                    next = jobs.try_recv().ok();
                }
            }
        }
        if !batch.is_empty() {
            commit_batch(&mut conn, batch, &config, &clock, counters);
        }
        for (limit, reply) in purges {
            let result = purge_batch(&mut conn, &config, clock.now_unix(), limit, counters);
            let _ = reply.send(result.map_err(WriteError::Store));
        }
    }
}

/// The order in which a batch takes its locks: deliveries by the order (or payment) they name,
/// then provider and event id; then the relay's work and the API's. Every instance sorts the
/// same way, so two batches that touch the same orders lock them in the same order.
fn lock_order(work: &Work) -> (u8, String, String, String) {
    match work {
        Work::Delivery { event, .. } => {
            let key = match &event.order_ref {
                OrderRef::OrderId(id) => id.clone(),
                _ => event.payment_ref().unwrap_or_default().to_owned(),
            };
            (
                0,
                key,
                event.provider.as_str().to_owned(),
                event.event_id.clone(),
            )
        }
        Work::OutboxResults { .. } => (1, String::new(), String::new(), String::new()),
        Work::OutboxClaim { .. } => (2, String::new(), String::new(), String::new()),
        Work::Idempotent { request, .. } => (
            3,
            request.order.order_id.clone(),
            String::new(),
            String::new(),
        ),
    }
}

fn commit_batch(
    conn: &mut Connection,
    mut batch: Vec<(Work, Span)>,
    config: &WriterConfig,
    clock: &SharedClock,
    counters: &WriterCounters,
) {
    batch.sort_by_cached_key(|(work, _)| lock_order(work));
    let Some((client, statements)) = conn.get(&config.target, counters) else {
        for (work, _) in batch {
            unrun(work).fail(unavailable);
        }
        return;
    };
    if run_batch(client, statements, batch, config, clock, counters) {
        conn.lose();
    }
}

/// Runs `batch` in one transaction and answers every unit: after COMMIT, or with 503 when it
/// does not commit. Returns true when the connection was lost.
fn run_batch(
    client: &mut Client,
    statements: &mut Statements,
    batch: Vec<(Work, Span)>,
    config: &WriterConfig,
    clock: &SharedClock,
    counters: &WriterCounters,
) -> bool {
    let now_unix = clock.now_unix();
    let now_ms = clock.now_millis();
    // Deliveries and the relay's work first, optimistically, without savepoints: a savepoint costs
    // two round trips per unit, and almost every batch succeeds whole. Every delivery of the batch
    // is claimed first, in one statement (`events::claim`); those that can go side by side are
    // applied together, in a few statements for them all (`events::apply_claimed_together`);
    // then each of the rest. If one unit fails, PostgreSQL has aborted the transaction: it is
    // rolled back and the whole batch runs again with a savepoint per unit, where that unit fails
    // alone. Each can run twice: nothing was committed or answered. API work cannot (its response
    // is worded once, an `FnOnce`), so it always runs in a savepoint of its own, after the rest.
    let (plain, api): (Vec<_>, Vec<_>) = batch
        .into_iter()
        .partition(|(work, _)| !matches!(work, Work::Idempotent { .. }));
    let Some(mut tx) = begin(client) else {
        plain
            .into_iter()
            .chain(api)
            .for_each(|(work, _)| unrun(work).fail(unavailable));
        return client.is_closed();
    };
    // The units' results, or the first failure and whose it was.
    let optimistic: Result<(Vec<Ran>, usize), (Failed, StoreError)> = (|| {
        let mut db = Db::new(&mut tx, statements);
        // Every delivery's claim first, in one statement, in the batch's lock order.
        let deliveries: Vec<_> = plain
            .iter()
            .filter_map(|(work, _)| match work {
                Work::Delivery { event, payload, .. } => Some((event, payload.as_str())),
                _ => None,
            })
            .collect();
        let claims =
            events::claim(&mut db, &deliveries, now_unix, false).map_err(|e| (Failed::Claim, e))?;
        // Then the claimed deliveries that can be applied side by side, together; the rest one
        // by one.
        let (indices, claimed): (Vec<usize>, Vec<(&NormalizedEvent, &Span)>) = plain
            .iter()
            .enumerate()
            .filter_map(|(index, (work, span))| match work {
                Work::Delivery { event, .. } => Some((index, (event, span))),
                _ => None,
            })
            .zip(&claims)
            .filter(|(_, claim)| **claim == events::Claim::Claimed)
            .map(|(delivery, _)| delivery)
            .unzip();
        let mut applied = vec![None; plain.len()];
        for (index, outcome) in indices.into_iter().zip(
            events::apply_claimed_together(&mut db, &claimed, now_unix)
                .map_err(|e| (Failed::Together, e))?,
        ) {
            applied[index] = outcome;
        }
        let together = applied.iter().flatten().count();
        let mut claims = claims.into_iter();
        let ran = plain
            .iter()
            .enumerate()
            .map(|(index, (work, span))| {
                let _entered = span.enter();
                let claim = match work {
                    Work::Delivery { .. } => claims.next(),
                    _ => None,
                };
                if let Some(outcome) = applied[index] {
                    return Ok(Ran::Delivery(outcome));
                }
                run_rerunnable(&mut db, work, claim, now_unix, now_ms)
                    .map_err(|e| (Failed::Unit(index), e))
            })
            .collect::<Result<_, _>>()?;
        Ok((ran, together))
    })();
    let mut together = 0;
    let (mut tx, mut done, batch) = match optimistic {
        Ok((ran, applied_together)) => {
            together = applied_together;
            let done: Vec<Done> = plain
                .into_iter()
                .zip(ran)
                .map(|((work, _), ran)| ran.done(work))
                .collect();
            (tx, done, api)
        }
        Err((failed, e)) => {
            drop(tx);
            if e.is_connection_lost() {
                tracing::error!(error = %crate::telemetry::ErrorChain(&e), "the connection was lost during the batch; everything in it gets 503");
                plain
                    .into_iter()
                    .chain(api)
                    .for_each(|(work, _)| unrun(work).fail(unavailable));
                return true;
            }
            tracing::debug!(error = %crate::telemetry::ErrorChain(&e), "a unit failed: rerunning the batch with a savepoint each");
            let mut plain = plain;
            match (failed, e.is_conflict()) {
                // A conflict with another transaction runs again with the rest; so does a
                // failure of the deliveries applied together, each then in its own savepoint,
                // where only the one at fault fails.
                (_, true) | (Failed::Together, _) => {}
                // Its own failure (a lock timeout, a constraint): answered now, not waited
                // for twice.
                (Failed::Unit(failed), false) => {
                    let (work, span) = plain.remove(failed);
                    let _entered = span.enter();
                    tracing::error!(error = %crate::telemetry::ErrorChain(&e), "a unit of the batch failed and was rolled back alone");
                    unrun(work).fail(move || clone_kind(&e));
                }
                // The batch's claim failed (a lock timeout: a table locked, an event another
                // transaction holds too long): every delivery of the batch is answered with
                // its error (503, which providers retry), not made to wait again one by one.
                (Failed::Claim, false) => {
                    let (deliveries, rest): (Vec<_>, Vec<_>) = plain
                        .into_iter()
                        .partition(|(work, _)| matches!(work, Work::Delivery { .. }));
                    tracing::error!(error = %crate::telemetry::ErrorChain(&e), deliveries = deliveries.len(), "the batch's claim failed; its deliveries were rolled back");
                    for (work, _) in deliveries {
                        unrun(work).fail(|| clone_kind(&e));
                    }
                    plain = rest;
                }
            }
            let Some(tx) = begin(client) else {
                plain
                    .into_iter()
                    .chain(api)
                    .for_each(|(work, _)| unrun(work).fail(unavailable));
                return client.is_closed();
            };
            (tx, Vec::new(), plain.into_iter().chain(api).collect())
        }
    };
    done.reserve(batch.len());
    let mut broken: Option<StoreError> = None;
    {
        let mut db = Db::new(&mut tx, statements);
        for (work, span) in batch {
            if broken.is_some() {
                done.push(unrun(work));
                continue;
            }
            let _entered = span.enter();
            let (answer, lost) = run_unit(&mut db, work, now_unix, now_ms);
            done.push(answer);
            broken = lost;
        }
    }
    if let Some(e) = broken {
        tracing::error!(error = %crate::telemetry::ErrorChain(&e), "the batch transaction is lost; everything in it gets 503");
        drop(tx);
        done.into_iter().for_each(|d| d.fail(unavailable));
        return e.is_connection_lost();
    }
    if config.commit_faults.take() {
        let _ = tx.rollback();
        done.into_iter().for_each(|d| d.fail(unavailable));
        return false;
    }
    let commit_started = std::time::Instant::now();
    if let Err(e) = tx.commit() {
        let e = StoreError::from(e);
        // The outcome of a COMMIT whose answer was lost is unknown: 503, and the provider's
        // redelivery finds the claim (a duplicate) or not (applied then).
        tracing::error!(error = %crate::telemetry::ErrorChain(&e), "COMMIT failed; everything in the batch gets 503");
        done.into_iter().for_each(|d| d.fail(unavailable));
        return e.is_connection_lost();
    }
    counters.committed(done.len(), commit_started.elapsed());
    WriterCounters::add(&counters.deliveries_together, together);
    done.iter().for_each(|d| d.count(counters));
    done.into_iter().for_each(Done::answer);
    false
}

/// Opens the batch's transaction; `None` (logged) when it cannot.
fn begin(client: &mut Client) -> Option<postgres::Transaction<'_>> {
    match client.transaction() {
        Ok(tx) => Some(tx),
        Err(e) => {
            let e = StoreError::from(e);
            tracing::error!(error = %crate::telemetry::ErrorChain(&e), "could not begin the write transaction; everything in the batch gets 503");
            None
        }
    }
}

/// What failed when a batch ran optimistically.
enum Failed {
    /// The claim of all its deliveries.
    Claim,
    /// The deliveries applied together.
    Together,
    /// The unit at this index.
    Unit(usize),
}

/// What a unit that can run twice did, before its answer is due.
enum Ran {
    Delivery(Outcome),
    Claim(Claimed),
    Results(Vec<bool>),
}

impl Ran {
    /// The answer to `work`, the unit that did this.
    fn done(self, work: Work) -> Done {
        match (self, work) {
            (Ran::Delivery(outcome), Work::Delivery { reply, .. }) => {
                Done::Delivery(reply, Ok(outcome))
            }
            (Ran::Claim(rows), Work::OutboxClaim { reply, .. }) => {
                Done::OutboxClaim(reply, Ok(rows))
            }
            (Ran::Results(recorded), Work::OutboxResults { reply, .. }) => {
                Done::OutboxResults(reply, Ok(recorded))
            }
            _ => unreachable!("a unit's result is of its own kind"),
        }
    }
}

/// Runs a unit that can run again (not API work) in the open transaction; a delivery whose
/// claim the batch made (or found taken) as `claim` says.
fn run_rerunnable(
    db: &mut Db<'_, '_>,
    work: &Work,
    claim: Option<events::Claim>,
    now_unix: i64,
    now_ms: i64,
) -> Result<Ran, StoreError> {
    Ok(match work {
        Work::Delivery { event, payload, .. } => Ran::Delivery(match claim {
            Some(events::Claim::Claimed) => events::apply_claimed(db, event, now_unix)?,
            Some(events::Claim::Taken) => Outcome::Duplicate,
            Some(events::Claim::Left) | None => {
                events::record_event_and_apply(db, event, payload, now_unix)?
            }
        }),
        Work::OutboxClaim { request, .. } => {
            Ran::Claim(outbox::claim_due_in_transaction(db, request, now_ms)?)
        }
        Work::OutboxResults {
            owner,
            results,
            outbox: kind,
            ..
        } => Ran::Results(outbox::record_results_in_transaction(
            db, *kind, owner, results, now_ms,
        )?),
        Work::Idempotent { .. } => unreachable!("API work runs in a savepoint of its own"),
    })
}

/// The answer to work that did not run (its error is set by [`Done::fail`]).
fn unrun(work: Work) -> Done {
    match work {
        Work::Delivery { reply, .. } => Done::Delivery(reply, Err(unavailable())),
        Work::Idempotent { reply, .. } => Done::Idempotent(reply, Err(unavailable())),
        Work::OutboxClaim { reply, .. } => Done::OutboxClaim(reply, Err(unavailable())),
        Work::OutboxResults { reply, .. } => Done::OutboxResults(reply, Err(unavailable())),
    }
}

/// An error of the same kind and text as `error`, for the one unit it belongs to (an engine's
/// error cannot be cloned).
fn clone_kind(error: &StoreError) -> StoreError {
    let kind = match error {
        StoreError::Database(e) => e.kind,
        _ => ErrorKind::Permanent,
    };
    StoreError::database(
        kind,
        std::io::Error::other(crate::telemetry::ErrorChain(error).to_string()),
    )
}

/// The error of work whose transaction did not commit.
fn unavailable() -> StoreError {
    StoreError::database(
        ErrorKind::Transient,
        std::io::Error::other("the batch transaction did not commit"),
    )
}

/// True for the failures a rerun of the same unit can get past: a deadlock, a serialization
/// failure. Not a lock timeout: it bounds how long a delivery waits, and is answered 503.
fn worth_rerunning(error: &StoreError) -> bool {
    error.is_conflict()
}

/// Runs one unit in a savepoint (again after a deadlock, up to [`TRANSIENT_RERUNS`] times).
/// The second value is set when the transaction itself is lost.
fn run_unit(
    db: &mut Db<'_, '_>,
    work: Work,
    now_unix: i64,
    now_ms: i64,
) -> (Done, Option<StoreError>) {
    match work {
        Work::Idempotent { request, reply } => {
            // Its response is worded once, inside the transaction (an `FnOnce`): no rerun.
            let client = request.client.clone();
            match db.in_savepoint(
                |db| idempotency::run_idempotent(db, request, now_unix),
                |_| true,
            ) {
                Ok(result) => {
                    if let Err(e) = &result {
                        tracing::error!(client, error = %crate::telemetry::ErrorChain(e), "an order request failed and was rolled back alone");
                    }
                    (Done::Idempotent(reply, result), None)
                }
                Err(lost) => (Done::Idempotent(reply, Err(unavailable())), Some(lost)),
            }
        }
        Work::Delivery {
            event,
            payload,
            reply,
        } => {
            let ran = rerun(
                db,
                |db| events::record_event_and_apply(db, &event, &payload, now_unix),
                |outcome| *outcome != Outcome::Duplicate,
            );
            match ran {
                Ok(result) => {
                    if let Err(e) = &result {
                        tracing::error!(provider = %event.provider, event_id = event.event_id, error = %crate::telemetry::ErrorChain(e), "delivery failed and was rolled back alone");
                    }
                    (Done::Delivery(reply, result), None)
                }
                Err(lost) => (Done::Delivery(reply, Err(unavailable())), Some(lost)),
            }
        }
        Work::OutboxClaim { request, reply } => {
            match rerun(
                db,
                |db| outbox::claim_due_in_transaction(db, &request, now_ms),
                |_| true,
            ) {
                Ok(result) => (Done::OutboxClaim(reply, result), None),
                Err(lost) => (Done::OutboxClaim(reply, Err(unavailable())), Some(lost)),
            }
        }
        Work::OutboxResults {
            owner,
            results,
            outbox: kind,
            reply,
        } => {
            match rerun(
                db,
                |db| outbox::record_results_in_transaction(db, kind, &owner, &results, now_ms),
                |_| true,
            ) {
                Ok(result) => (Done::OutboxResults(reply, result), None),
                Err(lost) => (Done::OutboxResults(reply, Err(unavailable())), Some(lost)),
            }
        }
    }
}

/// Runs `unit` in a savepoint; after a deadlock or serialization failure (rolled back to the
/// savepoint, which releases what it locked), once more, up to [`TRANSIENT_RERUNS`] times.
fn rerun<T>(
    db: &mut Db<'_, '_>,
    mut unit: impl FnMut(&mut Db<'_, '_>) -> Result<T, StoreError>,
    keep: impl Fn(&T) -> bool,
) -> Result<Result<T, StoreError>, StoreError> {
    let mut reruns = 0;
    loop {
        let result = db.in_savepoint(&mut unit, &keep)?;
        match result {
            Err(e) if worth_rerunning(&e) && reruns < TRANSIENT_RERUNS => {
                reruns += 1;
                tracing::debug!(error = %crate::telemetry::ErrorChain(&e), reruns, "rerunning a unit after a transient failure");
            }
            other => return Ok(other),
        }
    }
}

/// One purge batch in a transaction of its own, off the deliveries' batches.
fn purge_batch(
    conn: &mut Connection,
    config: &WriterConfig,
    now_unix: i64,
    limit: usize,
    counters: &WriterCounters,
) -> Result<Purged, StoreError> {
    let Some((client, statements)) = conn.get(&config.target, counters) else {
        return Err(unavailable());
    };
    let result = (|| {
        let mut tx = client.transaction()?;
        let purged = purge::purge_batch(&mut Db::new(&mut tx, statements), now_unix, limit)?;
        if config.commit_faults.take() {
            tx.rollback()?;
            return Err(StoreError::Injected("the purge batch's COMMIT"));
        }
        tx.commit()?;
        Ok(purged)
    })();
    if let Err(e) = &result {
        if e.is_connection_lost() {
            conn.lose();
        }
    }
    result
}
