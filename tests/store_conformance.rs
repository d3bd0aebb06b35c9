//! The storage-engine conformance suite: what every engine behind [`Store`] and [`Maintenance`]
//! must do, asserted through those two interfaces only.
//!
//! One suite, run against every engine (the pattern of River's `riverdrivertest`). The tests in
//! [`suite`] know nothing of any engine: each gets a fresh, empty database from an [`Engine`]
//! harness, with a [`ManualClock`] the store reads "now" from, so that retention, expiry and
//! leases are tested by moving the clock rather than by sleeping. [`conformance_suite!`] turns
//! every test into a `#[test]` for one engine:
//!
//! ```ignore
//! conformance_suite!(sqlite, SqliteEngine);
//! ```
//!
//! A new engine is done when it implements [`Engine`] and its one `conformance_suite!` line
//! passes, with nothing above the engine section of this file changed. Nothing outside that
//! section may name an engine, its types, or SQL.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use sekali::clock::{iso_millis, iso_seconds, Clock, ManualClock, SharedClock};
use sekali::domain::ledger::{Attempt, Dispute, DisputeStage, PaymentFacts, RefundedSnapshot};
use sekali::domain::{
    EmailAddress, NormalizedEvent, OrderRef, OrderStatus, PaymentReport, ProviderName,
};
use sekali::store::{
    ClaimRequest, ClaimedEmail, ClaimedForward, CommitFaults, CreateOrder, EventQuery, ForwardRow,
    IdempotentOutcome, Maintenance, NewOrder, OperatorChange, OrderQuery, OrderView, OutboxKind,
    OutboxQuery, OutboxRow, Outcome, PaymentView, Purged, Retried, RunDeletion, RunMarker,
    SendOutcome, SendResult, SetStatusError, Skipped, Store, StoreError, StoredResponse,
    Transition,
};
use serde_json::{json, Value};

// ------------------------------------------------------------------------------------------
// The harness: what an engine provides, and what every test gets.
// ------------------------------------------------------------------------------------------

/// An engine under test. Each test makes its own with [`Engine::new`] and opens one database.
pub trait Engine {
    /// A place for one test's database (a temporary directory, a schema, a database name), or
    /// `None` when the engine cannot run here (its server is not installed): the test then
    /// passes without running, and [`Engine::skipped`] is printed once.
    fn new() -> Option<Self>
    where
        Self: Sized;

    /// The one line printed when this engine's half of the suite is skipped.
    fn skipped() -> &'static str
    where
        Self: Sized,
    {
        ""
    }

    /// Opens a fresh, empty database: the server's [`Store`], which takes "now" from `clock`,
    /// and an operator's [`Maintenance`] connection to the same database.
    /// `faults` tells the store which commits to fail on purpose ("fail the next commit").
    fn open(
        &self,
        clock: SharedClock,
        faults: CommitFaults,
    ) -> (Arc<dyn Store>, Box<dyn Maintenance>);

    /// Where [`Maintenance::backup`] may write a copy (nothing there yet).
    fn backup_path(&self) -> PathBuf;

    /// A [`Maintenance`] over the copy [`Maintenance::backup`] wrote at `path`, or `None` when
    /// the engine's copies cannot be opened by a test (the backup test then checks the report
    /// only, and says so).
    fn open_backup(&self, path: &Path) -> Option<Box<dyn Maintenance>>;
}

/// Where every test's clock starts: 2026-01-01T00:00:00Z.
const T0: i64 = 1_767_225_600;
/// The retention of the events the tests build, unless they set one.
const RETENTION_SECS: u64 = 3 * 24 * 3600;
/// The relays' lease.
const LEASE_MS: i64 = 30_000;
/// The idempotency keys' retention, unless a test sets one.
const KEY_RETENTION_SECS: i64 = 24 * 3600;
const ALL: u32 = 1000;

/// What a test gets: the store, an operator's connection to the same database, the clock the
/// store reads, and its engine (for the backup).
pub struct Ctx {
    store: Arc<dyn Store>,
    ops: Box<dyn Maintenance>,
    clock: Arc<ManualClock>,
    engine: Rc<dyn Engine>,
    /// Fails the store's next commits on purpose.
    faults: CommitFaults,
}

/// Runs one test of the suite against a fresh database of `E`, then shuts the store down (from
/// this synchronous context: [`Store::shutdown`] blocks).
fn run<E, F, Fut>(test: F)
where
    E: Engine + 'static,
    F: FnOnce(Ctx) -> Fut,
    Fut: Future<Output = ()>,
{
    let Some(engine) = E::new() else {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| eprintln!("{}", E::skipped()));
        return;
    };
    let engine: Rc<dyn Engine> = Rc::new(engine);
    let clock = ManualClock::new(T0);
    let faults = CommitFaults::default();
    let (store, ops) = engine.open(clock.clone(), faults.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(test(Ctx {
        store: store.clone(),
        ops,
        clock,
        engine: engine.clone(),
        faults,
    }));
    store.shutdown();
}

/// Instantiates every test of [`suite`] for one engine: `conformance_suite!(module, Engine)`.
/// A test function left out of this list is dead code, which the lints refuse.
macro_rules! conformance_suite {
    ($module:ident, $engine:ty) => {
        mod $module {
            use super::*;

            conformance_suite!(@tests $engine;
                // claim
                a_new_event_is_processed_and_its_claim_is_readable,
                the_same_event_again_is_a_duplicate_and_changes_nothing,
                the_same_event_id_from_another_provider_is_another_event,
                a_claim_holds_until_its_retention_runs_out_and_the_event_is_then_new,
                a_live_claim_under_the_legacy_id_makes_a_duplicate,
                a_legacy_id_claimed_for_another_order_or_expired_makes_no_duplicate,
                concurrent_deliveries_of_one_event_apply_it_once,
                // every decision persisted
                the_first_event_of_an_order_creates_it_in_the_reported_status,
                a_payment_moves_a_pending_order_to_paid_and_queues_a_receipt,
                a_refund_of_a_paid_order_queues_a_refund_notice,
                a_failed_payment_queues_a_payment_failed_notice_and_can_still_be_paid,
                an_older_status_after_a_newer_one_is_stale_and_changes_nothing,
                the_same_status_again_is_processed_without_a_second_email,
                a_payment_that_does_not_match_an_api_order_needs_review_without_an_email,
                refunded_amounts_only_grow,
                a_reversal_of_a_paid_order_needs_review_without_an_email,
                an_event_without_a_change_is_ignored_and_recorded,
                an_event_with_no_order_to_act_on_is_ignored,
                a_stale_event_still_fills_in_details_the_order_lacked,
                an_event_naming_a_linked_payment_moves_its_order,
                // parked resolution
                an_event_for_an_unlinked_payment_is_parked_until_the_payment_is_linked,
                the_link_counts_every_fact_that_waited_on_the_payment,
                a_stale_event_still_links_its_payment_and_frees_what_waited_for_it,
                stripe_deliveries_out_of_order_end_where_they_would_in_order,
                // purge
                purge_batches_delete_expired_ids_and_keys_up_to_the_limit,
                the_purge_keeps_live_ids_parked_events_orders_and_emails,
                a_purge_pass_deletes_everything_expired_at_the_time_it_is_given,
                // idempotency keys
                a_new_key_creates_the_order_and_stores_the_response,
                the_same_key_and_request_replays_the_stored_response_byte_for_byte,
                the_same_key_with_another_request_is_refused_and_creates_nothing,
                keys_are_scoped_per_client,
                a_key_for_an_order_id_that_exists_stores_the_answer_for_none,
                a_key_past_its_retention_is_new_again,
                concurrent_requests_under_one_key_run_once,
                // outbox
                a_claim_takes_the_oldest_due_rows_up_to_its_limit_under_a_lease,
                a_leased_row_goes_to_no_other_relay_until_the_lease_runs_out,
                a_result_is_recorded_only_while_its_relay_holds_the_lease,
                a_result_after_its_lease_ran_out_is_refused_and_the_row_is_due_again,
                sent_skipped_and_dead_rows_are_never_claimed_again,
                a_failed_row_is_due_again_at_its_retry_time_and_not_before,
                an_untried_row_counts_no_attempt,
                retry_revives_a_dead_row_sends_a_waiting_one_now_and_leaves_the_rest,
                a_claimed_email_carries_its_orders_text_locale,
                // reads
                orders_page_in_order_id_order_after_a_cursor_and_by_status,
                a_missing_order_or_outbox_row_reads_as_none,
                events_are_listed_newest_first_by_provider_up_to_the_limit,
                events_are_filtered_by_outcome_order_and_time_together,
                events_are_filtered_by_type_and_end_time_and_paged_by_arrival,
                events_are_counted_by_provider_and_outcome_since_a_time,
                an_email_skipped_by_an_operator_is_never_claimed_unless_a_relay_holds_it,
                every_result_a_relay_records_is_kept_in_order_with_its_relay_and_error,
                an_events_kept_headers_are_stored_with_it_and_read_back,
                a_console_logout_holds_until_its_session_would_have_ended,
                an_event_claimed_again_after_its_retention_is_listed_as_the_newest,
                the_outbox_is_listed_newest_first_by_status,
                the_outbox_is_filtered_by_status_order_and_time_together,
                the_store_answers_its_health_check,
                stats_count_transactions_deliveries_and_relay_work,
                run_counts_count_the_rows_of_one_marker,
                // the load generator's rows
                orders_outside_runs_are_every_order_but_the_load_generators,
                deleting_a_run_removes_every_row_it_wrote_and_nothing_else,
                a_run_is_not_deleted_while_a_relay_holds_one_of_its_emails,
                // operator
                an_operator_can_set_any_status_and_gets_the_previous_one,
                setting_the_status_of_a_missing_order_is_no_such_order,
                settling_a_review_as_paid_queues_the_receipt_for_what_was_paid,
                an_operator_setting_the_status_the_order_has_is_refused,
                an_orders_history_names_who_made_each_change_and_why,
                an_orders_audit_trail_is_every_change_oldest_first,
                // the change feed
                the_change_feed_serves_every_change_once_in_commit_order_after_a_cursor,
                // an error means nothing was committed
                a_delivery_whose_commit_fails_leaves_nothing_and_is_new_when_sent_again,
                an_order_request_whose_commit_fails_keeps_no_key_and_no_order,
                a_claim_or_results_whose_commit_fails_change_no_row,
                a_purge_batch_whose_commit_fails_deletes_nothing,
                // forwarding
                with_forwarding_off_no_change_is_queued_to_forward,
                with_forwarding_on_every_change_is_queued_once_as_the_feed_serves_it,
                forwarded_changes_of_an_order_are_claimed_one_at_a_time_in_order,
                a_forward_waiting_to_be_tried_again_holds_back_its_orders_later_changes,
                a_dead_forward_holds_back_its_orders_later_changes_until_retried_or_skipped,
                a_leased_forward_goes_to_no_other_relay_until_its_lease_runs_out,
                a_forward_the_endpoint_never_received_counts_no_attempt,
                skip_and_retry_leave_a_forward_being_sent_or_finished_alone,
                forwards_are_listed_newest_first_and_filtered_by_status_order_and_time,
                concurrent_forward_claims_take_each_change_once_and_each_orders_in_order,
                // backup
                a_backup_holds_the_orders_and_events_as_they_were,
                a_backup_never_overwrites_an_existing_file,
                a_backup_holds_the_forwarded_changes_as_they_were,
            );
        }
    };
    (@tests $engine:ty; $($test:ident),+ $(,)?) => {
        $(
            #[test]
            fn $test() {
                run::<$engine, _, _>(suite::$test);
            }
        )+
    };
}

// ------------------------------------------------------------------------------------------
// Building events and API orders.
// ------------------------------------------------------------------------------------------

/// A [`NormalizedEvent`] under construction; by default a `stripe` event with no order and no
/// payment, remembered for [`RETENTION_SECS`]. Its facts are about the payment `p_{order}` of its
/// order unless it names another ([`Ev::payment`], [`Ev::via_payment`]).
#[derive(Clone)]
struct Ev(NormalizedEvent);

fn ev(event_id: &str) -> Ev {
    Ev(NormalizedEvent {
        provider: ProviderName::new("stripe").unwrap(),
        event_id: event_id.into(),
        event_type: "test.event".into(),
        order_ref: OrderRef::None,
        payment: None,
        payer_email: None,
        legacy_event_id: None,
        detail: None,
        retention: Duration::from_secs(RETENTION_SECS),
        headers: None,
    })
}

impl Ev {
    /// The request headers kept with it (a JSON object), as the HTTP route sets them.
    fn headers(mut self, headers: &str) -> Self {
        self.0.headers = Some(headers.to_owned());
        self
    }

    fn provider(mut self, name: &str) -> Self {
        self.0.provider = ProviderName::new(name).unwrap();
        self
    }

    fn kind(mut self, event_type: &str) -> Self {
        self.0.event_type = event_type.into();
        self
    }

    /// Names its order by id.
    fn order(mut self, order_id: &str) -> Self {
        self.0.order_ref = OrderRef::OrderId(order_id.into());
        if let Some(payment) = &mut self.0.payment {
            if payment.reference.is_empty() {
                payment.reference = format!("p_{order_id}");
            }
        }
        self
    }

    /// Names its order only through its payment `reference`, as a Stripe charge or dispute
    /// does.
    fn via_payment(mut self, reference: &str) -> Self {
        self.0.order_ref = OrderRef::Payment;
        self.report().reference = reference.into();
        self
    }

    /// Its facts are about the payment `reference`.
    fn payment(mut self, reference: &str) -> Self {
        self.report().reference = reference.into();
        self
    }

    fn report(&mut self) -> &mut PaymentReport {
        let default_reference = match &self.0.order_ref {
            OrderRef::OrderId(order) => format!("p_{order}"),
            _ => String::new(),
        };
        self.0.payment.get_or_insert_with(|| PaymentReport {
            reference: default_reference,
            aliases: Vec::new(),
            facts: PaymentFacts {
                currency: Some("USD".into()),
                requested: Some(1500),
                ..PaymentFacts::default()
            },
        })
    }

    fn facts(mut self, adjust: impl FnOnce(&mut PaymentFacts)) -> Self {
        adjust(&mut self.report().facts);
        self
    }

    /// The facts that say the order's payment reached `target`, for a payment of 1500 USD
    /// cents: money taken for paid, given back for a refund (with [`Ev::refunded`]), held by a
    /// dispute for disputed; an attempt that ended for failed, cancelled and expired.
    fn to(self, target: OrderStatus) -> Self {
        self.facts(|f| match target {
            OrderStatus::Pending => f.attempt = Some((Attempt::Pending, 0)),
            OrderStatus::Failed => f.attempt = Some((Attempt::Failed, 0)),
            OrderStatus::Cancelled => f.attempt = Some((Attempt::Canceled, 0)),
            OrderStatus::Expired => f.attempt = Some((Attempt::Expired, 0)),
            OrderStatus::Paid | OrderStatus::NeedsReview => f.captured = Some(1500),
            OrderStatus::PartiallyRefunded | OrderStatus::Refunded => {
                f.captured = Some(1500);
                f.refunded_snapshot = Some(RefundedSnapshot {
                    amount: if target == OrderStatus::Refunded {
                        1500
                    } else {
                        500
                    },
                    at: 0,
                });
            }
            OrderStatus::Disputed => {
                f.captured = Some(1500);
                f.disputes.insert(
                    "dp_1".into(),
                    Dispute {
                        amount: 1500,
                        stage: DisputeStage::Open,
                        withdrawn: true,
                        reinstated: false,
                    },
                );
            }
        })
    }

    /// Money taken: `amount`.
    fn paid(self, amount: i64) -> Self {
        self.facts(|f| f.captured = Some(amount))
    }

    /// Money given back, cumulative.
    fn refunded(self, amount: i64) -> Self {
        self.facts(|f| f.refunded_snapshot = Some(RefundedSnapshot { amount, at: 0 }))
    }

    fn currency(self, currency: &str) -> Self {
        self.facts(|f| f.currency = Some(currency.to_ascii_uppercase()))
    }

    fn no_amount(self) -> Self {
        self.facts(|f| f.requested = None)
    }

    fn email(mut self, address: &str) -> Self {
        self.0.payer_email = Some(EmailAddress::parse(address).unwrap());
        self
    }

    /// The provider says the payment did not stand (a Midtrans deny or cancel).
    fn reverses(self) -> Self {
        self.facts(|f| f.undone = true)
    }

    fn retention(mut self, secs: u64) -> Self {
        self.0.retention = Duration::from_secs(secs);
        self
    }

    fn legacy(mut self, legacy_event_id: &str) -> Self {
        self.0.legacy_event_id = Some(legacy_event_id.into());
        self
    }
}

/// The raw body stored with an event built here.
fn payload_of(event: &NormalizedEvent) -> String {
    json!({"id": event.event_id, "type": event.event_type}).to_string()
}

/// A payment of 1500 usd for `order_id`, to `sari@toko.example`.
fn paid(event_id: &str, order_id: &str) -> Ev {
    ev(event_id)
        .kind("payment_intent.succeeded")
        .order(order_id)
        .to(OrderStatus::Paid)
        .paid(1500)
        .email("sari@toko.example")
}

/// An operator's change to `status`, with a name and a reason.
pub fn by_operator(status: OrderStatus) -> OperatorChange {
    OperatorChange {
        status,
        operator: "operator-test".into(),
        reason: "checked by hand".into(),
    }
}

fn new_order(order_id: &str) -> NewOrder {
    NewOrder {
        order_id: order_id.into(),
        amount: 1500,
        currency: "usd".into(),
        provider: "stripe".into(),
        exponent: 2,
        customer_email: Some("budi@toko.example".into()),
        metadata: Some(r#"{"cart":"c-1"}"#.into()),
    }
}

/// The response the tests' `respond` stores: 201 with the order, or 409 without one.
fn respond_with(view: Option<&OrderView>) -> StoredResponse {
    match view {
        Some(view) => StoredResponse {
            status: 201,
            content_type: "application/json".into(),
            body: serde_json::to_string(view).unwrap(),
        },
        None => StoredResponse {
            status: 409,
            content_type: "application/problem+json".into(),
            body: r#"{"title":"the order exists"}"#.into(),
        },
    }
}

fn create(client: &str, key: &str, fingerprint: &str, order: NewOrder) -> CreateOrder {
    CreateOrder {
        client: client.into(),
        key: key.into(),
        fingerprint: fingerprint.into(),
        retention_secs: KEY_RETENTION_SECS,
        order,
        respond: Box::new(respond_with),
    }
}

/// A Stripe fixture as the provider parses it, with its body.
fn stripe_fixture(name: &str) -> (NormalizedEvent, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/stripe")
        .join(format!("{name}.json"));
    let body = std::fs::read_to_string(&path).expect("the fixture");
    let event = sekali::providers::stripe::parse_event(body.as_bytes()).expect("a Stripe event");
    (event, body)
}

fn status_of(view: &OrderView) -> OrderStatus {
    view.status.parse().expect("a known status")
}

fn params(row: &OutboxRow) -> Value {
    serde_json::from_str(&row.params).expect("params are JSON")
}

// ------------------------------------------------------------------------------------------
// What the tests do through the interfaces.
// ------------------------------------------------------------------------------------------

impl Ctx {
    async fn record(&self, event: Ev) -> Outcome {
        let payload = payload_of(&event.0);
        self.record_with(event, payload).await
    }

    async fn record_with(&self, event: Ev, payload: String) -> Outcome {
        self.store
            .record(event.0, payload)
            .await
            .expect("the delivery commits")
    }

    async fn create(&self, request: CreateOrder) -> IdempotentOutcome {
        self.store
            .create_order(request)
            .await
            .expect("the request commits")
    }

    /// Creates the API order `order` under a key of its own.
    async fn create_api_order(&self, order: NewOrder) -> OrderView {
        let key = format!("key-{}", order.order_id);
        let order_id = order.order_id.clone();
        let outcome = self.create(create("shop", &key, "fp", order)).await;
        assert!(
            matches!(&outcome, IdempotentOutcome::Fresh(r) if r.status == 201),
            "{outcome:?}"
        );
        self.order(&order_id).await.expect("the order was created")
    }

    async fn order(&self, order_id: &str) -> Option<OrderView> {
        self.store
            .order(order_id.into())
            .await
            .expect("the order is read")
    }

    /// An order's status and refunded amount.
    async fn refund_state(&self, order_id: &str) -> (String, i64) {
        let order = self.order(order_id).await.expect("the order exists");
        (order.status, order.refunded_amount)
    }

    async fn status(&self, order_id: &str) -> OrderStatus {
        let view = self.order(order_id).await;
        status_of(
            view.as_ref()
                .unwrap_or_else(|| panic!("no order {order_id}")),
        )
    }

    async fn all_orders(&self) -> Vec<OrderView> {
        self.store
            .orders(OrderQuery {
                status: None,
                after: None,
                limit: ALL,
            })
            .await
            .unwrap()
    }

    /// The one stored claim of `event_id` by `provider`.
    fn claim_of(&self, provider: &str, event_id: &str) -> sekali::store::EventDetail {
        let mut found = self.ops.find_events(event_id, Some(provider)).unwrap();
        assert_eq!(found.len(), 1, "{provider} {event_id}: {found:?}");
        found.remove(0)
    }

    fn outcome_of(&self, event_id: &str) -> String {
        self.claim_of("stripe", event_id).summary.outcome
    }

    /// Every outbox row, oldest first.
    fn outbox(&self) -> Vec<OutboxRow> {
        let mut rows = self.ops.outbox(&OutboxQuery::newest(ALL)).unwrap();
        rows.reverse();
        rows
    }

    /// The outbox rows of one order, oldest first.
    fn emails(&self, order_id: &str) -> Vec<OutboxRow> {
        self.outbox()
            .into_iter()
            .filter(|row| row.order_id == order_id)
            .collect()
    }

    fn templates(&self, order_id: &str) -> Vec<String> {
        self.emails(order_id)
            .into_iter()
            .map(|row| row.template)
            .collect()
    }

    fn row(&self, id: i64) -> OutboxRow {
        self.ops
            .outbox_row(id)
            .unwrap()
            .unwrap_or_else(|| panic!("no outbox row {id}"))
    }

    async fn claim(&self, owner: &str, limit: usize) -> Vec<ClaimedEmail> {
        self.store
            .claim_outbox(ClaimRequest {
                owner: owner.into(),
                lease_ms: LEASE_MS,
                limit,
                outbox: sekali::store::OutboxKind::Email,
            })
            .await
            .expect("the claim commits")
    }

    async fn results(&self, owner: &str, results: &[(i64, SendOutcome)]) -> Vec<bool> {
        let results = results
            .iter()
            .map(|(id, outcome)| SendResult {
                id: *id,
                outcome: outcome.clone(),
            })
            .collect();
        self.store
            .record_outbox_results(owner.into(), results)
            .await
            .expect("the results commit")
    }

    /// Everything the interfaces show of the database: orders, events with their payloads, and
    /// the outbox.
    async fn snapshot(&self) -> Value {
        let events = self.ops.events(&EventQuery::newest(ALL)).unwrap();
        let details: Vec<_> = events
            .iter()
            .map(|e| {
                self.ops
                    .find_events(&e.event_id, Some(&e.provider))
                    .unwrap()
            })
            .collect();
        json!({
            "orders": self.all_orders().await,
            "events": events,
            "details": details,
            "outbox": self.ops.outbox(&OutboxQuery::newest(ALL)).unwrap(),
        })
    }

    fn advance(&self, secs: u64) {
        self.clock.advance(Duration::from_secs(secs));
    }

    fn now(&self) -> i64 {
        self.clock.now_unix()
    }

    fn now_ms(&self) -> i64 {
        self.clock.now_millis()
    }
}

fn failed(retry_at_ms: Option<i64>) -> SendOutcome {
    SendOutcome::Failed {
        error: "550 mailbox unavailable".into(),
        retry_at_ms,
    }
}

fn untried(retry_at_ms: Option<i64>) -> SendOutcome {
    SendOutcome::Untried {
        error: "transport unavailable".into(),
        retry_at_ms,
    }
}

// ------------------------------------------------------------------------------------------
// The suite. Each test is a sentence, asserted through the interfaces only.
// ------------------------------------------------------------------------------------------

mod suite {
    use super::*;
    use OrderStatus::*;

    // --- claim ---------------------------------------------------------------------------

    /// A new event is processed, and its claim is stored with what was received: provider, id,
    /// type, order, outcome, when, until when, the payment and the body.
    pub async fn a_new_event_is_processed_and_its_claim_is_readable(t: Ctx) {
        let event = paid("evt_1", "ord_1").payment("pi_1");
        let payload = payload_of(&event.0);
        assert_eq!(t.record(event).await, Outcome::Processed);

        let claim = t.claim_of("stripe", "evt_1");
        assert_eq!(claim.summary.provider, "stripe");
        assert_eq!(claim.summary.event_id, "evt_1");
        assert_eq!(claim.summary.event_type, "payment_intent.succeeded");
        assert_eq!(claim.summary.order_id.as_deref(), Some("ord_1"));
        assert_eq!(claim.summary.outcome, "processed");
        assert_eq!(claim.summary.received_at, iso_seconds(T0));
        assert_eq!(
            claim.summary.expires_at,
            iso_seconds(T0 + RETENTION_SECS as i64)
        );
        assert_eq!(claim.payment_intent_id.as_deref(), Some("pi_1"));
        assert_eq!(claim.payload, payload);
        assert!(t
            .ops
            .find_events("evt_1", Some("midtrans"))
            .unwrap()
            .is_empty());
        assert!(t.ops.find_events("evt_2", None).unwrap().is_empty());
    }

    /// The same (provider, event id) again is a duplicate however different its content, and
    /// changes nothing: not the order, not the outbox, not the stored claim or its body.
    pub async fn the_same_event_again_is_a_duplicate_and_changes_nothing(t: Ctx) {
        assert_eq!(t.record(paid("evt_1", "ord_1")).await, Outcome::Processed);
        let before = t.snapshot().await;
        t.advance(60);

        assert_eq!(
            t.record_with(paid("evt_1", "ord_1"), "another body".into())
                .await,
            Outcome::Duplicate
        );
        // Whatever it now says: the claim decides, not the content.
        let refund = ev("evt_1").order("ord_1").to(Refunded).refunded(1500);
        assert_eq!(t.record(refund).await, Outcome::Duplicate);
        let other_order = ev("evt_1").order("ord_2").to(Pending);
        assert_eq!(t.record(other_order).await, Outcome::Duplicate);

        assert_eq!(t.snapshot().await, before);
        assert_eq!(t.order("ord_2").await, None);
    }

    /// Event ids are per provider: the same id from another provider is a different event, and
    /// each is a duplicate only of itself.
    pub async fn the_same_event_id_from_another_provider_is_another_event(t: Ctx) {
        assert_eq!(
            t.record(ev("evt_1").order("ord_1").to(Pending)).await,
            Outcome::Processed
        );
        let midtrans = ev("evt_1").provider("midtrans").order("ord_2").to(Pending);
        assert_eq!(t.record(midtrans.clone()).await, Outcome::Processed);
        assert_eq!(t.record(midtrans).await, Outcome::Duplicate);
        assert_eq!(
            t.record(ev("evt_1").order("ord_1").to(Pending)).await,
            Outcome::Duplicate
        );

        let mut found: Vec<_> = t
            .ops
            .find_events("evt_1", None)
            .unwrap()
            .into_iter()
            .map(|e| (e.summary.provider, e.summary.order_id))
            .collect();
        found.sort();
        assert_eq!(
            found,
            [
                ("midtrans".to_owned(), Some("ord_2".to_owned())),
                ("stripe".to_owned(), Some("ord_1".to_owned()))
            ]
        );
        assert_eq!(t.order("ord_2").await.unwrap().provider, "midtrans");
    }

    /// A claim holds for the event's retention, to the second: one second before it ends the
    /// event is a duplicate, from its end on it is new, claimed again from then on (before any
    /// purge has removed the old claim), and processed: it says again what its payment says.
    pub async fn a_claim_holds_until_its_retention_runs_out_and_the_event_is_then_new(t: Ctx) {
        let event = || ev("evt_1").order("ord_1").to(Pending).retention(60);
        assert_eq!(t.record(event()).await, Outcome::Processed);
        t.advance(59);
        assert_eq!(t.record(event()).await, Outcome::Duplicate);
        t.advance(1);
        assert_eq!(t.record(event()).await, Outcome::Processed);

        let claim = t.claim_of("stripe", "evt_1");
        assert_eq!(claim.summary.received_at, iso_seconds(T0 + 60));
        assert_eq!(claim.summary.expires_at, iso_seconds(T0 + 120));
        // The new claim is live for its own retention.
        t.advance(59);
        assert_eq!(t.record(event()).await, Outcome::Duplicate);
    }

    /// An event may carry the id an older sekali derived for the same delivery: a live claim
    /// under that id, for the same order or for none, makes it a duplicate with nothing written.
    pub async fn a_live_claim_under_the_legacy_id_makes_a_duplicate(t: Ctx) {
        assert_eq!(
            t.record(ev("old_1").order("ord_1").to(Paid)).await,
            Outcome::Processed
        );
        assert_eq!(
            t.record(ev("old_2").kind("ping")).await,
            Outcome::Ignored,
            "a claim of no order"
        );
        let before = t.snapshot().await;

        let same_order = ev("new_1").order("ord_1").to(Paid).legacy("old_1");
        assert_eq!(t.record(same_order).await, Outcome::Duplicate);
        let no_order = ev("new_2").order("ord_1").to(Paid).legacy("old_2");
        assert_eq!(t.record(no_order).await, Outcome::Duplicate);

        assert_eq!(t.snapshot().await, before);
        assert!(t.ops.find_events("new_1", None).unwrap().is_empty());
        assert!(t.ops.find_events("new_2", None).unwrap().is_empty());
    }

    /// A legacy id is only a hint: claimed for another order (the old form was ambiguous), or
    /// past its retention, it makes no duplicate, and the event is claimed under its own id.
    pub async fn a_legacy_id_claimed_for_another_order_or_expired_makes_no_duplicate(t: Ctx) {
        assert_eq!(
            t.record(ev("old_1").order("ord_a").to(Pending)).await,
            Outcome::Processed
        );
        let other_order = ev("new_1").order("ord_b").to(Pending).legacy("old_1");
        assert_eq!(t.record(other_order).await, Outcome::Processed);
        assert_eq!(t.status("ord_b").await, Pending);

        let short = ev("old_2").order("ord_c").to(Pending).retention(60);
        assert_eq!(t.record(short).await, Outcome::Processed);
        t.advance(60);
        let expired = ev("new_2").order("ord_c").to(Paid).legacy("old_2");
        assert_eq!(t.record(expired).await, Outcome::Processed);
        assert_eq!(t.status("ord_c").await, Paid);
        assert_eq!(t.claim_of("stripe", "new_2").summary.outcome, "processed");
    }

    /// Ten copies of one delivery at once: exactly one is processed, the rest are duplicates,
    /// and one receipt is queued.
    pub async fn concurrent_deliveries_of_one_event_apply_it_once(t: Ctx) {
        let event = paid("evt_1", "ord_1").0;
        let outcomes =
            join_all((0..10).map(|_| t.store.record(event.clone(), payload_of(&event)))).await;
        let outcomes: Vec<Outcome> = outcomes.into_iter().map(Result::unwrap).collect();
        let processed = outcomes
            .iter()
            .filter(|o| **o == Outcome::Processed)
            .count();
        let duplicates = outcomes
            .iter()
            .filter(|o| **o == Outcome::Duplicate)
            .count();
        assert_eq!((processed, duplicates), (1, 9), "{outcomes:?}");
        assert_eq!(t.templates("ord_1"), ["receipt"]);
    }

    // --- every decision persisted ----------------------------------------------------------

    /// The first event of an order creates it in the status it reports, with what it says of
    /// the order; a status with a notice queues it.
    pub async fn the_first_event_of_an_order_creates_it_in_the_reported_status(t: Ctx) {
        assert_eq!(
            t.record(paid("evt_1", "ord_1").payment("pi_1")).await,
            Outcome::Processed
        );
        let order = t.order("ord_1").await.unwrap();
        assert_eq!(
            order,
            OrderView {
                order_id: "ord_1".into(),
                status: "paid".into(),
                review_reason: None,
                provider: "stripe".into(),
                amount: Some(1500),
                refunded_amount: 0,
                currency: Some("USD".into()),
                paid_amount: None,
                paid_currency: None,
                customer_email: Some("sari@toko.example".into()),
                payer_email: Some("sari@toko.example".into()),
                metadata: None,
                source: "webhook".into(),
                payment_intent_id: Some("pi_1".into()),
                created_at: iso_seconds(T0),
                updated_at: iso_seconds(T0),
                payments: Some(vec![PaymentView {
                    provider: "stripe".into(),
                    payment_ref: "pi_1".into(),
                    currency: Some("USD".into()),
                    requested: Some(1500),
                    authorized: None,
                    captured: 1500,
                    released: 0,
                    returned: 0,
                    withdrawn: 0,
                    attempt: "succeeded".into(),
                    reversed: false,
                    refunds: vec![],
                    disputes: vec![],
                }]),
                history: Some(vec![Transition {
                    changed_at: iso_seconds(T0),
                    from_status: None,
                    to_status: "paid".into(),
                    refunded_amount: 0,
                    provider: "stripe".into(),
                    event_id: "evt_1".into(),
                    actor: None,
                    reason: None,
                }]),
            }
        );
        assert_eq!(t.templates("ord_1"), ["receipt"]);

        let pending = ev("evt_2").provider("midtrans").order("ord_2").to(Pending);
        assert_eq!(t.record(pending).await, Outcome::Processed);
        let order = t.order("ord_2").await.unwrap();
        assert_eq!(
            (order.status.as_str(), order.provider.as_str()),
            ("pending", "midtrans")
        );
        assert!(t.emails("ord_2").is_empty(), "pending carries no notice");

        let refunded = ev("evt_3")
            .order("ord_3")
            .to(PartiallyRefunded)
            .refunded(400);
        assert_eq!(t.record(refunded).await, Outcome::Processed);
        let order = t.order("ord_3").await.unwrap();
        assert_eq!(
            (order.status.as_str(), order.refunded_amount),
            ("partially_refunded", 400)
        );
        // First seen refunded: its payment took money (a receipt) and gave some back (a notice).
        assert_eq!(t.templates("ord_3"), ["receipt", "refund_notice"]);
    }

    /// pending → paid: the order moves, and a receipt is queued in the same commit: due now, to
    /// the payment's address, with what the template renders.
    pub async fn a_payment_moves_a_pending_order_to_paid_and_queues_a_receipt(t: Ctx) {
        assert_eq!(
            t.record(ev("evt_1").order("ord_1").to(Pending)).await,
            Outcome::Processed
        );
        t.advance(10);
        assert_eq!(t.record(paid("evt_2", "ord_1")).await, Outcome::Processed);

        let order = t.order("ord_1").await.unwrap();
        assert_eq!(order.status, "paid");
        assert_eq!(order.customer_email.as_deref(), Some("sari@toko.example"));
        assert_eq!(order.created_at, iso_seconds(T0));
        assert_eq!(order.updated_at, iso_seconds(T0 + 10));

        let emails = t.emails("ord_1");
        assert_eq!(emails.len(), 1, "{emails:?}");
        let receipt = &emails[0];
        assert_eq!(receipt.template, "receipt");
        assert_eq!(receipt.recipient.as_deref(), Some("sari@toko.example"));
        assert_eq!(receipt.status, "pending");
        assert_eq!(receipt.attempts, 0);
        assert_eq!(receipt.created_at, iso_seconds(T0 + 10));
        assert_eq!(
            receipt.next_attempt_at.as_deref(),
            Some(iso_millis((T0 + 10) * 1000).as_str())
        );
        assert_eq!(
            (
                &receipt.lease_owner,
                &receipt.sent_at,
                &receipt.first_tried_at
            ),
            (&None, &None, &None)
        );
        assert_eq!(receipt.idempotency_key.len(), 64);
        assert!(receipt
            .idempotency_key
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        let p = params(receipt);
        assert_eq!(
            (
                &p["order_id"],
                &p["status"],
                &p["amount"],
                &p["currency"],
                &p["exponent"],
                &p["refunded_amount"],
                &p["provider"],
                &p["event_id"],
            ),
            (
                &json!("ord_1"),
                &json!("paid"),
                &json!(1500),
                &json!("USD"),
                &json!(2),
                &json!(0),
                &json!("stripe"),
                &json!("evt_2"),
            )
        );
    }

    /// paid → refunded: the refunded amount is kept and a refund notice is queued.
    pub async fn a_refund_of_a_paid_order_queues_a_refund_notice(t: Ctx) {
        t.record(paid("evt_1", "ord_1")).await;
        let refund = ev("evt_2")
            .kind("charge.refunded")
            .order("ord_1")
            .to(Refunded)
            .refunded(1500);
        assert_eq!(t.record(refund).await, Outcome::Processed);

        let order = t.order("ord_1").await.unwrap();
        assert_eq!(
            (order.status.as_str(), order.refunded_amount),
            ("refunded", 1500)
        );
        assert_eq!(t.templates("ord_1"), ["receipt", "refund_notice"]);
        let notice = t.emails("ord_1").pop().unwrap();
        assert_eq!(notice.recipient.as_deref(), Some("sari@toko.example"));
        let p = params(&notice);
        assert_eq!(
            (&p["status"], &p["refunded_amount"], &p["event_id"]),
            (&json!("refunded"), &json!(1500), &json!("evt_2"))
        );
    }

    /// pending → failed queues a payment_failed notice; a failed order can still be paid, which
    /// queues the receipt.
    pub async fn a_failed_payment_queues_a_payment_failed_notice_and_can_still_be_paid(t: Ctx) {
        t.record(ev("evt_1").order("ord_1").to(Pending)).await;
        let failure = ev("evt_2")
            .order("ord_1")
            .to(Failed)
            .email("sari@toko.example");
        assert_eq!(t.record(failure).await, Outcome::Processed);
        assert_eq!(t.status("ord_1").await, Failed);
        assert_eq!(t.templates("ord_1"), ["payment_failed"]);
        assert_eq!(params(&t.emails("ord_1")[0])["status"], json!("failed"));

        assert_eq!(t.record(paid("evt_3", "ord_1")).await, Outcome::Processed);
        assert_eq!(t.status("ord_1").await, Paid);
        assert_eq!(t.templates("ord_1"), ["payment_failed", "receipt"]);
    }

    /// An older status after a newer one is stale: recorded as such, and nothing else changes
    /// (no status, no timestamp, no email).
    pub async fn an_older_status_after_a_newer_one_is_stale_and_changes_nothing(t: Ctx) {
        t.record(paid("evt_1", "ord_1")).await;
        let before = t.snapshot().await;
        t.advance(5);

        let late = ev("evt_0").order("ord_1").to(Pending);
        assert_eq!(t.record(late).await, Outcome::Stale);
        let stale = t.claim_of("stripe", "evt_0").summary;
        assert_eq!(
            (stale.outcome.as_str(), stale.order_id.as_deref()),
            ("stale", Some("ord_1"))
        );
        assert_eq!(t.snapshot().await["orders"], before["orders"]);
        assert_eq!(t.snapshot().await["outbox"], before["outbox"]);

        t.record(ev("evt_2").order("ord_1").to(Refunded).refunded(1500))
            .await;
        assert_eq!(
            t.record(paid("evt_3", "ord_1")).await,
            Outcome::Stale,
            "paid after refunded"
        );
        assert_eq!(t.status("ord_1").await, Refunded);
        assert_eq!(t.templates("ord_1"), ["receipt", "refund_notice"]);
    }

    /// A second event saying just what the ledger knows (another event of the same change) is
    /// processed: no move and no second email.
    pub async fn the_same_status_again_is_processed_without_a_second_email(t: Ctx) {
        t.record(paid("evt_1", "ord_1")).await;
        let before = t.snapshot().await;
        t.advance(5);
        assert_eq!(t.record(paid("evt_2", "ord_1")).await, Outcome::Processed);
        assert_eq!(t.snapshot().await["orders"], before["orders"]);
        assert_eq!(t.templates("ord_1"), ["receipt"]);
    }

    /// A payment for an API order that does not match its amount or currency moves it to
    /// needs_review, not paid, with its reason; the customer's receipt says what was taken. A
    /// second payment that matches is a second payment: still in review. A matching one
    /// (currency in any case) pays it. A webhook order has nothing of the shop's own to match.
    pub async fn a_payment_that_does_not_match_an_api_order_needs_review_without_an_email(t: Ctx) {
        t.create_api_order(new_order("ord_less")).await;
        let less = paid("evt_1", "ord_less").paid(1000);
        assert_eq!(t.record(less).await, Outcome::AmountMismatch);
        assert_eq!(t.status("ord_less").await, NeedsReview);
        assert_eq!(t.outcome_of("evt_1"), "amount_mismatch");
        assert_eq!(
            t.order("ord_less").await.unwrap().review_reason.as_deref(),
            Some("stripe payment p_ord_less took $10.00; the order is for $15.00")
        );
        assert_eq!(t.templates("ord_less"), ["receipt"]);
        assert_eq!(
            t.record(paid("evt_2", "ord_less").payment("pi_2")).await,
            Outcome::NeedsReview,
            "a second payment"
        );
        assert_eq!(t.status("ord_less").await, NeedsReview);

        t.create_api_order(new_order("ord_eur")).await;
        let euros = paid("evt_3", "ord_eur").currency("eur");
        assert_eq!(t.record(euros).await, Outcome::AmountMismatch);
        assert_eq!(t.status("ord_eur").await, NeedsReview);

        t.create_api_order(new_order("ord_ok")).await;
        let matching = paid("evt_4", "ord_ok").currency("USD");
        assert_eq!(t.record(matching).await, Outcome::Processed);
        assert_eq!(t.status("ord_ok").await, Paid);
        assert_eq!(t.templates("ord_ok"), ["receipt"]);

        t.record(ev("evt_5").order("ord_hook").to(Pending)).await;
        let less = paid("evt_6", "ord_hook").paid(1000);
        assert_eq!(t.record(less).await, Outcome::Processed);
        assert_eq!(t.status("ord_hook").await, Paid);
    }

    /// Refunded money only grows: a larger partial refund moves again with a new notice, a
    /// smaller one is stale (an equal one changes nothing), a full refund reporting less than
    /// already refunded is stale, and the full refund completes it.
    pub async fn refunded_amounts_only_grow(t: Ctx) {
        t.record(paid("evt_1", "ord_1")).await;
        let partial =
            |id: &str, amount| ev(id).order("ord_1").to(PartiallyRefunded).refunded(amount);
        assert_eq!(t.record(partial("evt_2", 500)).await, Outcome::Processed);
        assert_eq!(
            t.refund_state("ord_1").await,
            ("partially_refunded".into(), 500)
        );
        assert_eq!(t.record(partial("evt_3", 700)).await, Outcome::Processed);
        assert_eq!(
            t.refund_state("ord_1").await,
            ("partially_refunded".into(), 700)
        );
        assert_eq!(t.record(partial("evt_4", 300)).await, Outcome::Stale);
        // The same figure again says what is known: processed, nothing changed, no notice.
        assert_eq!(t.record(partial("evt_5", 700)).await, Outcome::Processed);
        let older_full = ev("evt_6").order("ord_1").to(Refunded).refunded(400);
        assert_eq!(t.record(older_full).await, Outcome::Stale);
        assert_eq!(
            t.refund_state("ord_1").await,
            ("partially_refunded".into(), 700)
        );
        let full = ev("evt_7").order("ord_1").to(Refunded).refunded(1500);
        assert_eq!(t.record(full).await, Outcome::Processed);
        assert_eq!(t.refund_state("ord_1").await, ("refunded".into(), 1500));

        let notices: Vec<Value> = t
            .emails("ord_1")
            .iter()
            .filter(|row| row.template == "refund_notice")
            .map(|row| params(row)["refunded_amount"].clone())
            .collect();
        assert_eq!(notices, [json!(500), json!(700), json!(1500)]);
    }

    /// A provider reversing a payment it settled moves a paid order to needs_review, recorded
    /// as reversed, with no email; before a payment the same event is a plain cancellation.
    pub async fn a_reversal_of_a_paid_order_needs_review_without_an_email(t: Ctx) {
        t.record(paid("evt_1", "ord_1").provider("midtrans")).await;
        let deny = |id: &str, order: &str| {
            ev(id)
                .provider("midtrans")
                .kind("deny")
                .order(order)
                .to(Cancelled)
                .reverses()
        };
        assert_eq!(t.record(deny("evt_2", "ord_1")).await, Outcome::Reversed);
        assert_eq!(t.status("ord_1").await, NeedsReview);
        assert_eq!(t.claim_of("midtrans", "evt_2").summary.outcome, "reversed");
        assert_eq!(t.templates("ord_1"), ["receipt"]);

        t.record(ev("evt_3").provider("midtrans").order("ord_2").to(Pending))
            .await;
        assert_eq!(t.record(deny("evt_4", "ord_2")).await, Outcome::Processed);
        assert_eq!(t.status("ord_2").await, Cancelled);
        assert!(t.emails("ord_2").is_empty());
    }

    /// An event type sekali does not act on is ignored but recorded (a redelivery is then a
    /// duplicate), and creates no order.
    pub async fn an_event_without_a_change_is_ignored_and_recorded(t: Ctx) {
        let event = ev("evt_1").kind("customer.created").order("ord_1");
        assert_eq!(t.record(event.clone()).await, Outcome::Ignored);
        let claim = t.claim_of("stripe", "evt_1").summary;
        assert_eq!(
            (claim.outcome.as_str(), claim.order_id.as_deref()),
            ("ignored", Some("ord_1"))
        );
        assert_eq!(t.order("ord_1").await, None);
        assert!(t.outbox().is_empty());
        assert_eq!(t.record(event).await, Outcome::Duplicate);
    }

    /// A change with no order to act on (no reference, or a payment no order has and that
    /// need not wait) is ignored and recorded without an order.
    pub async fn an_event_with_no_order_to_act_on_is_ignored(t: Ctx) {
        assert_eq!(t.record(ev("evt_1")).await, Outcome::Ignored);
        // A payment no order has yet: its facts wait on it.
        let unlinked = ev("evt_2").via_payment("pi_x").to(Paid);
        assert_eq!(t.record(unlinked).await, Outcome::Parked);
        for (id, outcome) in [("evt_1", "ignored"), ("evt_2", "parked")] {
            let claim = t.claim_of("stripe", id).summary;
            assert_eq!((claim.outcome.as_str(), claim.order_id), (outcome, None));
        }
        assert!(t.all_orders().await.is_empty());
        assert!(t.outbox().is_empty());
    }

    /// Details the order lacks (here the customer's address) are filled in from any event,
    /// even a stale one, which still moves nothing and changes nothing else.
    pub async fn a_stale_event_still_fills_in_details_the_order_lacked(t: Ctx) {
        t.record(ev("evt_1").order("ord_1").to(Paid)).await;
        let before = t.order("ord_1").await.unwrap();
        assert_eq!(before.customer_email, None);
        t.advance(5);
        let late = ev("evt_0")
            .order("ord_1")
            .to(Pending)
            .email("sari@toko.example");
        assert_eq!(t.record(late).await, Outcome::Stale);
        assert_eq!(
            t.order("ord_1").await.unwrap(),
            OrderView {
                customer_email: Some("sari@toko.example".into()),
                payer_email: Some("sari@toko.example".into()),
                ..before
            },
            "the address, and nothing else"
        );
        assert_eq!(t.templates("ord_1"), ["receipt"]);
    }

    /// Once an event has linked a payment to its order, an event naming only that payment
    /// moves that order.
    pub async fn an_event_naming_a_linked_payment_moves_its_order(t: Ctx) {
        t.record(paid("evt_1", "ord_1").payment("pi_1")).await;
        let refund = ev("evt_2").via_payment("pi_1").to(Refunded).refunded(1500);
        assert_eq!(t.record(refund).await, Outcome::Processed);
        assert_eq!(t.status("ord_1").await, Refunded);
        assert_eq!(
            t.claim_of("stripe", "evt_2").summary.order_id.as_deref(),
            Some("ord_1")
        );
        // A chargeback after a full refund takes the money back a second time: recorded, and
        // the order needs a look.
        let dispute = ev("evt_3").via_payment("pi_1").to(Disputed);
        assert_eq!(t.record(dispute).await, Outcome::NeedsReview);
        assert_eq!(
            t.order("ord_1").await.unwrap().review_reason.as_deref(),
            Some("$30.00 given back (refunds $15.00, chargebacks $15.00) is more than the $15.00 stripe payment pi_1 took")
        );
    }

    // --- parked resolution -----------------------------------------------------------------

    /// An event that must wait for its payment's link is parked: recorded, no order. Linking
    /// another payment leaves it parked; the event that links its payment applies it in the
    /// same commit, and its claim then says what became of it.
    pub async fn an_event_for_an_unlinked_payment_is_parked_until_the_payment_is_linked(t: Ctx) {
        let dispute = ev("evt_dispute")
            .kind("charge.dispute.created")
            .via_payment("pi_9")
            .to(Disputed)
            .no_amount();
        assert_eq!(t.record(dispute.clone()).await, Outcome::Parked);
        let claim = t.claim_of("stripe", "evt_dispute");
        assert_eq!(
            (
                claim.summary.outcome.as_str(),
                claim.summary.order_id.as_deref()
            ),
            ("parked", None)
        );
        assert_eq!(claim.payment_intent_id.as_deref(), Some("pi_9"));
        assert!(t.all_orders().await.is_empty());
        assert_eq!(t.record(dispute).await, Outcome::Duplicate);

        t.record(paid("evt_other", "ord_8").payment("pi_8")).await;
        assert_eq!(t.outcome_of("evt_dispute"), "parked");

        t.advance(5);
        let link = paid("evt_paid", "ord_9").payment("pi_9");
        assert_eq!(t.record(link).await, Outcome::Processed);
        let order = t.order("ord_9").await.unwrap();
        assert_eq!(order.status, "disputed");
        assert_eq!(order.payment_intent_id.as_deref(), Some("pi_9"));
        let claim = t.claim_of("stripe", "evt_dispute").summary;
        assert_eq!(
            (claim.outcome.as_str(), claim.order_id.as_deref()),
            ("processed", Some("ord_9"))
        );
        assert_eq!(t.templates("ord_9"), ["receipt"], "a dispute has no notice");

        // Applied once: a later link of the same payment applies nothing again.
        let again = paid("evt_paid_2", "ord_9").payment("pi_9");
        assert_eq!(t.record(again).await, Outcome::Stale);
        assert_eq!(t.status("ord_9").await, Disputed);
    }

    /// Every fact that waited on the payment counts when it is linked: a partial refund and the
    /// full refund, merged whatever their order.
    pub async fn the_link_counts_every_fact_that_waited_on_the_payment(t: Ctx) {
        let partial = ev("evt_partial")
            .via_payment("pi_9")
            .to(PartiallyRefunded)
            .refunded(500);
        assert_eq!(t.record(partial).await, Outcome::Parked);
        t.advance(1);
        let full = ev("evt_full")
            .via_payment("pi_9")
            .to(Refunded)
            .refunded(1500);
        assert_eq!(t.record(full).await, Outcome::Parked);
        t.advance(1);

        let link = paid("evt_paid", "ord_9").payment("pi_9");
        assert_eq!(t.record(link).await, Outcome::Processed);
        let order = t.order("ord_9").await.unwrap();
        assert_eq!(
            (order.status.as_str(), order.refunded_amount),
            ("refunded", 1500)
        );
        assert_eq!(t.outcome_of("evt_partial"), "processed");
        assert_eq!(t.outcome_of("evt_full"), "processed");
        let notices: Vec<Value> = t
            .emails("ord_9")
            .iter()
            .map(|row| json!([row.template, params(row)["refunded_amount"]]))
            .collect();
        // The facts that waited count together: the money given back is told once, in all.
        assert_eq!(
            notices,
            [json!(["receipt", 0]), json!(["refund_notice", 1500])]
        );
    }

    /// The link is made whatever else the linking event says: a late event that brings its
    /// payment nothing new still ties it to its order, and what waited on the payment counts.
    pub async fn a_stale_event_still_links_its_payment_and_frees_what_waited_for_it(t: Ctx) {
        t.record(ev("evt_created").order("ord_9").to(Pending)).await;
        let dispute = ev("evt_dispute").via_payment("pi_9").to(Disputed);
        assert_eq!(t.record(dispute).await, Outcome::Parked);
        let late = ev("evt_processing")
            .kind("payment_intent.processing")
            .order("ord_9")
            .payment("pi_9")
            .to(Pending);
        assert_eq!(t.record(late).await, Outcome::Processed);
        let order = t.order("ord_9").await.unwrap();
        assert_eq!(order.status, "disputed");
        assert_eq!(order.payment_intent_id.as_deref(), Some("pi_9"));
        assert_eq!(t.outcome_of("evt_dispute"), "processed");
    }

    /// Real Stripe deliveries, parsed by the provider: a partial refund that arrives before the
    /// payment it refunds is parked, the payment applies it, and each body is kept byte for
    /// byte.
    pub async fn stripe_deliveries_out_of_order_end_where_they_would_in_order(t: Ctx) {
        let refund = stripe_fixture("charge.refunded.partial");
        let payment = stripe_fixture("payment_intent.succeeded");
        assert_eq!(
            t.store.record(refund.0, refund.1.clone()).await.unwrap(),
            Outcome::Parked
        );
        assert_eq!(
            t.store.record(payment.0, payment.1.clone()).await.unwrap(),
            Outcome::Processed
        );

        let order = t.order("ord_1001").await.unwrap();
        assert_eq!(
            (order.status.as_str(), order.refunded_amount, order.amount),
            ("partially_refunded", 1000, Some(2500))
        );
        assert_eq!(t.templates("ord_1001"), ["receipt", "refund_notice"]);
        let stored_refund = t.claim_of("stripe", "evt_1QA0003refundpartial01");
        assert_eq!(stored_refund.summary.outcome, "processed");
        assert_eq!(stored_refund.summary.order_id.as_deref(), Some("ord_1001"));
        assert_eq!(stored_refund.payload, refund.1);
        assert_eq!(
            t.claim_of("stripe", "evt_1QA0002succeeded000001").payload,
            payment.1
        );
    }

    // --- purge -------------------------------------------------------------------------------

    /// Five ids and three idempotency keys that expire at T0 + 60, two ids and a key that live
    /// longer, and a parked event that expires with the first ids.
    async fn expired_and_live(t: &Ctx) {
        for i in 0..5 {
            let event = ev(&format!("evt_old_{i}"))
                .order("ord_1")
                .to(Pending)
                .retention(60);
            assert_ne!(t.record(event).await, Outcome::Duplicate);
        }
        for i in 0..2 {
            let event = ev(&format!("evt_live_{i}")).order("ord_1").to(Pending);
            assert_ne!(t.record(event).await, Outcome::Duplicate);
        }
        let parked = ev("evt_parked")
            .via_payment("pi_9")
            .to(Disputed)
            .retention(60);
        assert_eq!(t.record(parked).await, Outcome::Parked);
        for i in 0..4 {
            let mut request = create(
                "shop",
                &format!("key-{i}"),
                "fp",
                new_order(&format!("ord_api_{i}")),
            );
            // Three keys expire with the ids; the fourth lives on.
            request.retention_secs = if i < 3 { 60 } else { 3600 };
            t.create(request).await;
        }
    }

    /// `purge_batch(limit)` deletes up to `limit` expired ids and up to `limit` expired keys in
    /// one go, says how many, and whether it may have left more; nothing before the expiry.
    pub async fn purge_batches_delete_expired_ids_and_keys_up_to_the_limit(t: Ctx) {
        expired_and_live(&t).await;
        t.advance(59);
        assert_eq!(t.store.purge_batch(100).await.unwrap(), Purged::default());

        t.advance(1);
        let first = t.store.purge_batch(2).await.unwrap();
        assert_eq!(
            first,
            Purged {
                events: 2,
                idempotency_keys: 2
            }
        );
        assert!(first.was_full(2));
        let second = t.store.purge_batch(2).await.unwrap();
        assert_eq!(
            second,
            Purged {
                events: 2,
                idempotency_keys: 1
            }
        );
        assert!(second.was_full(2));
        let third = t.store.purge_batch(2).await.unwrap();
        assert_eq!(
            third,
            Purged {
                events: 1,
                idempotency_keys: 0
            }
        );
        assert!(!third.was_full(2));
        assert_eq!(t.store.purge_batch(2).await.unwrap(), Purged::default());
        for i in 0..5 {
            assert!(
                t.ops
                    .find_events(&format!("evt_old_{i}"), None)
                    .unwrap()
                    .is_empty(),
                "evt_old_{i}"
            );
        }
    }

    /// The purge deletes nothing but expired ids and keys: live ids, parked events (work
    /// waiting, not a deduplication record), orders and emails stay, and a live key still
    /// replays. A purged id is new again.
    pub async fn the_purge_keeps_live_ids_parked_events_orders_and_emails(t: Ctx) {
        expired_and_live(&t).await;
        t.record(paid("evt_paid", "ord_2")).await;
        t.advance(3600 - 1);
        let orders = t.all_orders().await;
        let outbox = t.ops.outbox(&OutboxQuery::newest(ALL)).unwrap();

        let purged = t.store.purge_batch(100).await.unwrap();
        assert_eq!(
            purged,
            Purged {
                events: 5,
                idempotency_keys: 3
            }
        );
        let mut left: Vec<String> = t
            .ops
            .events(&EventQuery::newest(ALL))
            .unwrap()
            .into_iter()
            .map(|e| e.event_id)
            .collect();
        left.sort();
        assert_eq!(left, ["evt_live_0", "evt_live_1", "evt_paid", "evt_parked"]);
        assert_eq!(t.outcome_of("evt_parked"), "parked");
        assert_eq!(t.all_orders().await, orders);
        assert_eq!(
            serde_json::to_value(t.ops.outbox(&OutboxQuery::newest(ALL)).unwrap()).unwrap(),
            serde_json::to_value(outbox).unwrap()
        );
        let live_key = create("shop", "key-3", "fp", new_order("ord_api_3"));
        assert!(matches!(
            t.create(live_key).await,
            IdempotentOutcome::Replayed(_)
        ));
        // Its id is gone: it is new again.
        let purged_id = ev("evt_old_0").order("ord_1").to(Pending);
        assert_eq!(t.record(purged_id).await, Outcome::Processed);
    }

    /// `Maintenance::purge_all_expired` is a whole pass at the time it is given (not the
    /// store's clock), in batches, until nothing expired is left.
    pub async fn a_purge_pass_deletes_everything_expired_at_the_time_it_is_given(t: Ctx) {
        expired_and_live(&t).await;
        assert_eq!(
            t.ops.purge_all_expired(T0 + 59, 2).unwrap(),
            Purged::default()
        );
        assert_eq!(
            t.ops.purge_all_expired(T0 + 60, 2).unwrap(),
            Purged {
                events: 5,
                idempotency_keys: 3
            }
        );
        assert_eq!(
            t.ops.purge_all_expired(T0 + 60, 2).unwrap(),
            Purged::default()
        );
        assert_eq!(t.ops.events(&EventQuery::newest(ALL)).unwrap().len(), 3);
        assert_eq!(t.outcome_of("evt_parked"), "parked");
    }

    // --- idempotency keys --------------------------------------------------------------------

    /// A new key creates the API order in pending and stores the response its `respond` renders
    /// from the created order.
    pub async fn a_new_key_creates_the_order_and_stores_the_response(t: Ctx) {
        let seen: Arc<Mutex<Option<Option<OrderView>>>> = Arc::default();
        let mut request = create("shop", "key-1", "fp-1", new_order("ord_1"));
        let saw = seen.clone();
        request.respond = Box::new(move |view| {
            *saw.lock().unwrap() = Some(view.cloned());
            respond_with(view)
        });
        let outcome = t.create(request).await;

        let view = seen
            .lock()
            .unwrap()
            .clone()
            .expect("respond was called")
            .expect("with the created order");
        assert_eq!(
            view,
            OrderView {
                order_id: "ord_1".into(),
                status: "pending".into(),
                review_reason: None,
                provider: "stripe".into(),
                amount: Some(1500),
                refunded_amount: 0,
                currency: Some("usd".into()),
                paid_amount: None,
                paid_currency: None,
                customer_email: Some("budi@toko.example".into()),
                payer_email: None,
                metadata: Some(json!({"cart": "c-1"})),
                source: "api".into(),
                payment_intent_id: None,
                created_at: iso_seconds(T0),
                updated_at: iso_seconds(T0),
                payments: Some(vec![]),
                history: Some(vec![Transition {
                    changed_at: iso_seconds(T0),
                    from_status: None,
                    to_status: "pending".into(),
                    refunded_amount: 0,
                    provider: "api".into(),
                    event_id: "api:shop".into(),
                    actor: Some("shop".into()),
                    reason: None,
                }]),
            }
        );
        assert_eq!(outcome, IdempotentOutcome::Fresh(respond_with(Some(&view))));
        assert_eq!(t.order("ord_1").await, Some(view));
        assert!(t.outbox().is_empty(), "pending carries no notice");
    }

    /// The same key and fingerprint replays the stored response byte for byte, without running
    /// the work again.
    pub async fn the_same_key_and_request_replays_the_stored_response_byte_for_byte(t: Ctx) {
        let IdempotentOutcome::Fresh(first) = t
            .create(create("shop", "key-1", "fp-1", new_order("ord_1")))
            .await
        else {
            panic!("a new key")
        };
        t.advance(3600);
        let calls = Arc::new(AtomicUsize::new(0));
        let mut again = create("shop", "key-1", "fp-1", new_order("ord_1"));
        let counted = calls.clone();
        again.respond = Box::new(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            StoredResponse {
                status: 500,
                content_type: "text/plain".into(),
                body: "rendered again".into(),
            }
        });
        assert_eq!(t.create(again).await, IdempotentOutcome::Replayed(first));
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        assert_eq!(t.all_orders().await.len(), 1);
        assert_eq!(t.order("ord_1").await.unwrap().updated_at, iso_seconds(T0));
    }

    /// The same key with another fingerprint is refused, and its order is not created.
    pub async fn the_same_key_with_another_request_is_refused_and_creates_nothing(t: Ctx) {
        t.create(create("shop", "key-1", "fp-1", new_order("ord_1")))
            .await;
        let other = create("shop", "key-1", "fp-2", new_order("ord_2"));
        assert_eq!(
            t.create(other).await,
            IdempotentOutcome::FingerprintMismatch
        );
        assert_eq!(t.order("ord_2").await, None);
        // The stored response is untouched.
        let same = create("shop", "key-1", "fp-1", new_order("ord_1"));
        assert!(matches!(
            t.create(same).await,
            IdempotentOutcome::Replayed(r) if r.status == 201
        ));
    }

    /// Keys are per client: another client's same key is a new key.
    pub async fn keys_are_scoped_per_client(t: Ctx) {
        t.create(create("shop", "key-1", "fp-1", new_order("ord_1")))
            .await;
        let other_client = create("pos", "key-1", "fp-2", new_order("ord_2"));
        assert!(matches!(
            t.create(other_client).await,
            IdempotentOutcome::Fresh(r) if r.status == 201
        ));
        assert_eq!(t.status("ord_2").await, Pending);
        let replay = create("pos", "key-1", "fp-2", new_order("ord_2"));
        assert!(matches!(
            t.create(replay).await,
            IdempotentOutcome::Replayed(_)
        ));
    }

    /// A new key for an order id that exists (from a webhook or another key) changes nothing:
    /// `respond` gets `None`, and that answer is what the key stores and replays.
    pub async fn a_key_for_an_order_id_that_exists_stores_the_answer_for_none(t: Ctx) {
        t.record(paid("evt_1", "ord_1")).await;
        let before = t.order("ord_1").await;
        let outcome = t
            .create(create("shop", "key-1", "fp-1", new_order("ord_1")))
            .await;
        assert_eq!(outcome, IdempotentOutcome::Fresh(respond_with(None)));
        assert_eq!(t.order("ord_1").await, before, "the order is untouched");
        let replay = t
            .create(create("shop", "key-1", "fp-1", new_order("ord_1")))
            .await;
        assert_eq!(replay, IdempotentOutcome::Replayed(respond_with(None)));

        t.create(create("shop", "key-2", "fp-2", new_order("ord_2")))
            .await;
        let outcome = t
            .create(create("shop", "key-3", "fp-3", new_order("ord_2")))
            .await;
        assert_eq!(outcome, IdempotentOutcome::Fresh(respond_with(None)));
    }

    /// A key is remembered for its retention, to the second; after it the key is new again (and
    /// may carry another request).
    pub async fn a_key_past_its_retention_is_new_again(t: Ctx) {
        let mut request = create("shop", "key-1", "fp-1", new_order("ord_1"));
        request.retention_secs = 60;
        t.create(request).await;
        t.advance(59);
        let within = create("shop", "key-1", "fp-2", new_order("ord_2"));
        assert_eq!(
            t.create(within).await,
            IdempotentOutcome::FingerprintMismatch
        );
        t.advance(1);
        let after = create("shop", "key-1", "fp-2", new_order("ord_2"));
        assert!(matches!(
            t.create(after).await,
            IdempotentOutcome::Fresh(r) if r.status == 201
        ));
        assert_eq!(t.status("ord_2").await, Pending);
        let replay = create("shop", "key-1", "fp-2", new_order("ord_2"));
        assert!(matches!(
            t.create(replay).await,
            IdempotentOutcome::Replayed(r) if r.status == 201
        ));
    }

    /// Five requests under one key at once: one runs; each other replays its response, or, on
    /// an engine whose writer connections run transactions side by side (PostgreSQL's), is
    /// refused as in flight while that one holds the key (nothing of it written). The server
    /// itself never sends one key to the store twice at once: its in-flight guard answers the
    /// second request 409 first.
    pub async fn concurrent_requests_under_one_key_run_once(t: Ctx) {
        let outcomes = join_all((0..5).map(|_| {
            t.store
                .create_order(create("shop", "key-1", "fp-1", new_order("ord_1")))
        }))
        .await;
        let outcomes: Vec<_> = outcomes.into_iter().map(Result::unwrap).collect();
        let fresh: Vec<_> = outcomes
            .iter()
            .filter_map(|o| match o {
                IdempotentOutcome::Fresh(r) => Some(r.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(fresh.len(), 1, "{outcomes:?}");
        assert_eq!(fresh[0].status, 201);
        for outcome in &outcomes {
            assert!(
                matches!(outcome, IdempotentOutcome::Fresh(r) | IdempotentOutcome::Replayed(r) if *r == fresh[0])
                    || matches!(outcome, IdempotentOutcome::InFlight),
                "{outcome:?}"
            );
        }
        assert_eq!(t.ops.transitions("ord_1").unwrap().len(), 1, "created once");
    }

    // --- outbox --------------------------------------------------------------------------------

    /// `n` paid orders `ord_0`.. with one receipt each, created in that order; their row ids.
    async fn receipts(t: &Ctx, n: usize) -> Vec<i64> {
        for i in 0..n {
            let event = paid(&format!("evt_{i}"), &format!("ord_{i}"));
            assert_eq!(t.record(event).await, Outcome::Processed);
        }
        (0..n)
            .map(|i| t.emails(&format!("ord_{i}"))[0].id)
            .collect()
    }

    /// A claim takes due rows, the oldest first, up to its limit, and leases them to its owner
    /// until now + lease; a leased row is not claimed again, even by its owner.
    pub async fn a_claim_takes_the_oldest_due_rows_up_to_its_limit_under_a_lease(t: Ctx) {
        let ids = receipts(&t, 3).await;
        let claimed = t.claim("relay-a", 2).await;
        let claimed_ids: Vec<i64> = claimed.iter().map(|e| e.id).collect();
        assert_eq!(claimed_ids, ids[..2]);
        for email in &claimed {
            let row = t.row(email.id);
            assert_eq!(email.order_id, row.order_id);
            assert_eq!(email.template, "receipt");
            assert_eq!(email.recipient.as_deref(), Some("sari@toko.example"));
            assert_eq!(email.params, row.params);
            assert_eq!(email.idempotency_key, row.idempotency_key);
            assert_eq!((email.attempts, email.first_tried_ms), (0, None));
            assert_eq!(email.locale, None);
            assert_eq!(row.status, "pending");
            assert_eq!(row.lease_owner.as_deref(), Some("relay-a"));
            assert_eq!(
                row.lease_until.as_deref(),
                Some(iso_millis(T0 * 1000 + LEASE_MS).as_str())
            );
        }
        let rest: Vec<i64> = t.claim("relay-a", 10).await.iter().map(|e| e.id).collect();
        assert_eq!(rest, [ids[2]]);
        assert!(t.claim("relay-b", 10).await.is_empty());
        assert!(t.claim("relay-a", 10).await.is_empty());
    }

    /// While a lease holds, no other relay gets the row; once it has run out the row is due
    /// again, and the relay that held it can no longer record a result for it.
    pub async fn a_leased_row_goes_to_no_other_relay_until_the_lease_runs_out(t: Ctx) {
        let ids = receipts(&t, 1).await;
        assert_eq!(t.claim("relay-a", 10).await.len(), 1);
        t.advance((LEASE_MS / 1000 - 1) as u64);
        assert!(t.claim("relay-b", 10).await.is_empty());
        t.advance(1);
        let taken: Vec<i64> = t.claim("relay-b", 10).await.iter().map(|e| e.id).collect();
        assert_eq!(taken, ids);
        assert_eq!(t.row(ids[0]).lease_owner.as_deref(), Some("relay-b"));

        let row = serde_json::to_value(t.row(ids[0])).unwrap();
        assert_eq!(
            t.results("relay-a", &[(ids[0], SendOutcome::Sent)]).await,
            [false]
        );
        assert_eq!(serde_json::to_value(t.row(ids[0])).unwrap(), row);
        assert_eq!(
            t.results("relay-b", &[(ids[0], SendOutcome::Sent)]).await,
            [true]
        );
        assert_eq!(t.row(ids[0]).status, "sent");
    }

    /// A result is recorded only by the relay holding the row's lease, and only while it does:
    /// per result the answer says whether it was, and a refused one leaves the row unchanged.
    pub async fn a_result_is_recorded_only_while_its_relay_holds_the_lease(t: Ctx) {
        let ids = receipts(&t, 2).await;
        assert_eq!(t.claim("relay-a", 1).await.len(), 1);
        let (held, unclaimed) = (ids[0], ids[1]);
        let rows = || serde_json::to_value([t.row(held), t.row(unclaimed)]).unwrap();
        let before = rows();

        for outcome in [
            SendOutcome::Sent,
            failed(None),
            failed(Some(t.now_ms() + 60_000)),
            untried(None),
            SendOutcome::Skipped,
        ] {
            assert_eq!(
                t.results("relay-x", &[(held, outcome.clone())]).await,
                [false],
                "another relay: {outcome:?}"
            );
            assert_eq!(
                t.results("relay-a", &[(unclaimed, outcome.clone())]).await,
                [false],
                "a row not claimed: {outcome:?}"
            );
        }
        assert_eq!(
            t.results("relay-a", &[(999_999, SendOutcome::Sent)]).await,
            [false]
        );
        assert_eq!(rows(), before);

        // One batch, answered per row.
        assert_eq!(
            t.results(
                "relay-a",
                &[(held, SendOutcome::Sent), (unclaimed, SendOutcome::Sent)]
            )
            .await,
            [true, false]
        );
        assert_eq!(t.row(held).status, "sent");
        assert_eq!(t.row(unclaimed).status, "pending");
        // Recorded once: the lease ended with it, in the same batch too.
        t.advance(LEASE_MS as u64 / 1000 - 10);
        assert_eq!(t.claim("relay-a", 10).await.len(), 1);
        assert_eq!(
            t.results(
                "relay-a",
                &[(unclaimed, SendOutcome::Sent), (unclaimed, failed(None))]
            )
            .await,
            [true, false]
        );
        assert_eq!(t.row(unclaimed).status, "sent");
        assert_eq!(t.results("relay-a", &[(held, failed(None))]).await, [false]);
        assert_eq!(t.row(held).status, "sent");
    }

    /// A relay that overran its lease finds its result refused, even when no other relay has
    /// claimed the row since: the row is as it was, due again, and the next claim takes it.
    pub async fn a_result_after_its_lease_ran_out_is_refused_and_the_row_is_due_again(t: Ctx) {
        let ids = receipts(&t, 1).await;
        assert_eq!(t.claim("relay-a", 1).await.len(), 1);
        t.advance(LEASE_MS as u64 / 1000);
        let before = serde_json::to_value(t.row(ids[0])).unwrap();
        for outcome in [SendOutcome::Sent, failed(None), SendOutcome::Skipped] {
            assert_eq!(
                t.results("relay-a", &[(ids[0], outcome.clone())]).await,
                [false],
                "{outcome:?}"
            );
        }
        assert_eq!(serde_json::to_value(t.row(ids[0])).unwrap(), before);
        assert_eq!(t.claim("relay-b", 1).await.len(), 1);
    }

    /// Sent (one attempt, sent now), skipped (no attempt) and dead (a counted failure with no
    /// retry) rows leave the lease and are never claimed again.
    pub async fn sent_skipped_and_dead_rows_are_never_claimed_again(t: Ctx) {
        let ids = receipts(&t, 3).await;
        assert_eq!(t.claim("relay-a", 10).await.len(), 3);
        t.advance(2);
        let now = iso_millis(t.now_ms());
        let recorded = t
            .results(
                "relay-a",
                &[
                    (ids[0], SendOutcome::Sent),
                    (ids[1], SendOutcome::Skipped),
                    (ids[2], failed(None)),
                ],
            )
            .await;
        assert_eq!(recorded, [true, true, true]);

        let sent = t.row(ids[0]);
        assert_eq!((sent.status.as_str(), sent.attempts), ("sent", 1));
        assert_eq!(sent.sent_at.as_deref(), Some(now.as_str()));
        assert_eq!(sent.first_tried_at.as_deref(), Some(now.as_str()));
        assert_eq!(sent.last_error, None);
        let skipped = t.row(ids[1]);
        assert_eq!((skipped.status.as_str(), skipped.attempts), ("skipped", 0));
        assert_eq!(skipped.sent_at, None);
        assert!(skipped.last_error.is_some());
        let dead = t.row(ids[2]);
        assert_eq!((dead.status.as_str(), dead.attempts), ("dead", 1));
        assert_eq!(dead.last_error.as_deref(), Some("550 mailbox unavailable"));
        for row in [&sent, &skipped, &dead] {
            assert_eq!(
                (&row.next_attempt_at, &row.lease_owner, &row.lease_until),
                (&None, &None, &None),
                "{row:?}"
            );
        }

        t.advance(7 * 24 * 3600);
        assert!(t.claim("relay-a", 10).await.is_empty());
        assert!(t.claim("relay-b", 10).await.is_empty());
    }

    /// A counted failure with a retry time leaves the row pending with one more attempt and
    /// its error, due at that time and not a second before; its first try's time is kept.
    pub async fn a_failed_row_is_due_again_at_its_retry_time_and_not_before(t: Ctx) {
        let ids = receipts(&t, 1).await;
        t.claim("relay-a", 10).await;
        let first_try = t.now_ms();
        let retry_at = first_try + 60_000;
        assert_eq!(
            t.results("relay-a", &[(ids[0], failed(Some(retry_at)))])
                .await,
            [true]
        );
        let row = t.row(ids[0]);
        assert_eq!((row.status.as_str(), row.attempts), ("pending", 1));
        assert_eq!(row.last_error.as_deref(), Some("550 mailbox unavailable"));
        assert_eq!(row.next_attempt_at, Some(iso_millis(retry_at)));
        assert_eq!(row.first_tried_at, Some(iso_millis(first_try)));
        assert_eq!((row.lease_owner, row.lease_until), (None, None));

        t.advance(59);
        assert!(t.claim("relay-a", 10).await.is_empty());
        t.advance(1);
        let again = t.claim("relay-b", 10).await;
        assert_eq!(again.len(), 1);
        assert_eq!(
            (again[0].attempts, again[0].first_tried_ms),
            (1, Some(first_try))
        );

        let retry_at = t.now_ms() + 60_000;
        assert_eq!(
            t.results("relay-b", &[(ids[0], failed(Some(retry_at)))])
                .await,
            [true]
        );
        let row = t.row(ids[0]);
        assert_eq!(row.attempts, 2);
        assert_eq!(row.first_tried_at, Some(iso_millis(first_try)));
    }

    /// A try that never reached the transport counts no attempt and sets no first try: due
    /// again at its retry time, or dead (withheld) without one; its error is kept.
    pub async fn an_untried_row_counts_no_attempt(t: Ctx) {
        let ids = receipts(&t, 2).await;
        t.claim("relay-a", 10).await;
        let retry_at = t.now_ms() + 60_000;
        let recorded = t
            .results(
                "relay-a",
                &[(ids[0], untried(Some(retry_at))), (ids[1], untried(None))],
            )
            .await;
        assert_eq!(recorded, [true, true]);

        let waiting = t.row(ids[0]);
        assert_eq!((waiting.status.as_str(), waiting.attempts), ("pending", 0));
        assert_eq!(waiting.first_tried_at, None);
        assert_eq!(waiting.next_attempt_at, Some(iso_millis(retry_at)));
        assert_eq!(waiting.last_error.as_deref(), Some("transport unavailable"));
        let withheld = t.row(ids[1]);
        assert_eq!((withheld.status.as_str(), withheld.attempts), ("dead", 0));
        assert_eq!(withheld.first_tried_at, None);
        assert_eq!(
            withheld.last_error.as_deref(),
            Some("transport unavailable")
        );

        t.advance(59);
        assert!(t.claim("relay-a", 10).await.is_empty());
        t.advance(1);
        let again = t.claim("relay-a", 10).await;
        assert_eq!(again.len(), 1);
        assert_eq!(
            (again[0].id, again[0].attempts, again[0].first_tried_ms),
            (ids[0], 0, None)
        );
    }

    /// `retry` brings a dead row back to pending, due at the time given, with its attempts
    /// and first try reset; it makes a pending row waiting for its backoff due at that time,
    /// with its attempts and first try kept (an earlier due time is kept); it leaves a row
    /// under a live lease, a sent one and a skipped one alone, saying why.
    pub async fn retry_revives_a_dead_row_sends_a_waiting_one_now_and_leaves_the_rest(t: Ctx) {
        let ids = receipts(&t, 5).await;
        t.record(ev("evt_nobody").order("ord_nobody").to(Paid))
            .await; // no recipient
        let nobody = t.emails("ord_nobody")[0].id;
        t.claim("relay-a", 10).await;
        let retry_at = t.now_ms() + 3_600_000;
        let recorded = t
            .results(
                "relay-a",
                &[
                    (ids[0], failed(None)),
                    (ids[1], SendOutcome::Sent),
                    (ids[2], failed(Some(retry_at))),
                    (ids[3], untried(Some(t.now_ms()))),
                    (nobody, SendOutcome::Skipped),
                ],
            )
            .await;
        assert_eq!(recorded, [true; 5]);
        // ids[4] stays claimed by relay-a, whose lease has 20 s left.
        t.advance(10);

        assert_eq!(
            t.ops.retry(ids[1], t.now_ms()).unwrap(),
            Retried::Finished {
                status: "sent".into()
            }
        );
        assert_eq!(
            t.ops.retry(nobody, t.now_ms()).unwrap(),
            Retried::Finished {
                status: "skipped".into()
            }
        );
        assert_eq!(t.ops.retry(999_999, t.now_ms()).unwrap(), Retried::Missing);
        let leased = t.row(ids[4]);
        assert_eq!(
            t.ops.retry(ids[4], t.now_ms()).unwrap(),
            Retried::Leased {
                owner: "relay-a".into(),
                until: leased.lease_until.clone().unwrap()
            }
        );
        assert_eq!(
            serde_json::to_value(t.row(ids[4])).unwrap(),
            serde_json::to_value(&leased).unwrap(),
            "a leased row is left alone"
        );
        assert_eq!(t.row(ids[1]).status, "sent");

        // Dead: pending, due now, a fresh start.
        assert_eq!(t.ops.retry(ids[0], t.now_ms()).unwrap(), Retried::Revived);
        let row = t.row(ids[0]);
        assert_eq!((row.status.as_str(), row.attempts), ("pending", 0));
        assert_eq!(row.first_tried_at, None);
        assert_eq!(row.next_attempt_at, Some(iso_millis(t.now_ms())));

        // Waiting for its backoff: due now, its attempts and first try kept.
        let before = t.row(ids[2]);
        assert_eq!(
            t.ops.retry(ids[2], t.now_ms()).unwrap(),
            Retried::DueNow {
                was: iso_millis(retry_at),
                attempts: 1
            }
        );
        let row = t.row(ids[2]);
        assert_eq!((row.status.as_str(), row.attempts), ("pending", 1));
        assert_eq!(row.first_tried_at, before.first_tried_at);
        assert!(row.first_tried_at.is_some());
        assert_eq!(row.next_attempt_at, Some(iso_millis(t.now_ms())));

        // Already due: keeps its earlier time, and its place in the claims' order.
        let due_since = t.row(ids[3]).next_attempt_at.unwrap();
        assert_eq!(
            t.ops.retry(ids[3], t.now_ms()).unwrap(),
            Retried::DueNow {
                was: due_since.clone(),
                attempts: 0
            }
        );
        assert_eq!(t.row(ids[3]).next_attempt_at, Some(due_since));

        let mut claimed: Vec<i64> = t.claim("relay-b", 10).await.iter().map(|e| e.id).collect();
        claimed.sort();
        assert_eq!(claimed, [ids[0], ids[2], ids[3]]);

        // Once the lease of the row relay-a held ran out (it died), it is pending and due.
        t.advance(LEASE_MS as u64 / 1000 - 10);
        let (owner, until) = (leased.lease_owner, leased.lease_until);
        assert!(owner.is_some() && until.is_some());
        assert!(matches!(
            t.ops.retry(ids[4], t.now_ms()).unwrap(),
            Retried::DueNow { attempts: 0, .. }
        ));
        let row = t.row(ids[4]);
        assert_eq!(
            (row.lease_owner, row.lease_until),
            (None, None),
            "the dead lease cleared"
        );
    }

    /// A claimed email carries its order's `metadata.locale` when that is text, and none
    /// otherwise (another type, no metadata, a webhook order).
    pub async fn a_claimed_email_carries_its_orders_text_locale(t: Ctx) {
        for (order_id, metadata) in [
            ("ord_id", Some(r#"{"locale":"id-ID"}"#)),
            ("ord_number", Some(r#"{"locale":5}"#)),
            ("ord_none", None),
        ] {
            let mut order = new_order(order_id);
            order.metadata = metadata.map(str::to_owned);
            t.create_api_order(order).await;
            t.record(paid(&format!("evt_{order_id}"), order_id)).await;
        }
        t.record(paid("evt_hook", "ord_hook")).await;

        let mut locales: Vec<(String, Option<String>)> = t
            .claim("relay-a", 10)
            .await
            .into_iter()
            .map(|e| (e.order_id, e.locale))
            .collect();
        locales.sort();
        assert_eq!(
            locales,
            [
                ("ord_hook".to_owned(), None),
                ("ord_id".to_owned(), Some("id-ID".to_owned())),
                ("ord_none".to_owned(), None),
                ("ord_number".to_owned(), None),
            ]
        );
    }

    // --- reads ---------------------------------------------------------------------------------

    /// Orders page by order id: a limit, a cursor after which to start, and a status filter.
    pub async fn orders_page_in_order_id_order_after_a_cursor_and_by_status(t: Ctx) {
        for (order_id, status) in [
            ("ord_c", Paid),
            ("ord_a", Pending),
            ("ord_e", Paid),
            ("ord_b", Failed),
            ("ord_d", Paid),
        ] {
            let event = ev(&format!("evt_{order_id}")).order(order_id).to(status);
            t.record(event).await;
        }
        let page = |status: Option<OrderStatus>, after: Option<&str>, limit| {
            let query = OrderQuery {
                status,
                after: after.map(str::to_owned),
                limit,
            };
            let store = t.store.clone();
            async move {
                store
                    .orders(query)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|o| o.order_id)
                    .collect::<Vec<_>>()
            }
        };
        assert_eq!(page(None, None, 2).await, ["ord_a", "ord_b"]);
        assert_eq!(page(None, Some("ord_b"), 2).await, ["ord_c", "ord_d"]);
        assert_eq!(page(None, Some("ord_d"), 2).await, ["ord_e"]);
        assert!(page(None, Some("ord_e"), 2).await.is_empty());
        assert_eq!(
            page(Some(Paid), None, 10).await,
            ["ord_c", "ord_d", "ord_e"]
        );
        assert_eq!(page(Some(Paid), Some("ord_c"), 1).await, ["ord_d"]);
        assert!(page(Some(Refunded), None, 10).await.is_empty());
        assert_eq!(
            page(None, Some("ord_"), 10).await,
            ["ord_a", "ord_b", "ord_c", "ord_d", "ord_e"]
        );
    }

    /// A missing order or outbox row reads as none, through the store and the operator's
    /// connection alike; an existing order reads the same through both.
    pub async fn a_missing_order_or_outbox_row_reads_as_none(t: Ctx) {
        assert_eq!(t.order("ord_missing").await, None);
        assert_eq!(t.ops.order("ord_missing").unwrap(), None);
        assert!(t.ops.outbox_row(1).unwrap().is_none());
        t.record(paid("evt_1", "ord_1")).await;
        assert_eq!(t.ops.order("ord_1").unwrap(), t.order("ord_1").await);
        assert!(t.ops.outbox_row(999_999).unwrap().is_none());
    }

    /// Events are listed newest first, optionally of one provider, up to the limit.
    pub async fn events_are_listed_newest_first_by_provider_up_to_the_limit(t: Ctx) {
        for (id, provider) in [
            ("evt_1", "stripe"),
            ("evt_2", "midtrans"),
            ("evt_3", "stripe"),
            ("evt_4", "xendit"),
        ] {
            t.record(ev(id).provider(provider).order("ord_1").to(Pending))
                .await;
            t.advance(1);
        }
        let ids = |provider: Option<&str>, limit| -> Vec<String> {
            let query = EventQuery {
                provider: provider.map(str::to_owned),
                ..EventQuery::newest(limit)
            };
            t.ops
                .events(&query)
                .unwrap()
                .into_iter()
                .map(|e| e.event_id)
                .collect()
        };
        assert_eq!(ids(None, 10), ["evt_4", "evt_3", "evt_2", "evt_1"]);
        assert_eq!(ids(None, 2), ["evt_4", "evt_3"]);
        assert_eq!(ids(Some("stripe"), 10), ["evt_3", "evt_1"]);
        assert_eq!(ids(Some("midtrans"), 10), ["evt_2"]);
        assert!(ids(Some("other"), 10).is_empty());
        let newest = &t.ops.events(&EventQuery::newest(1)).unwrap()[0];
        assert_eq!(
            (newest.provider.as_str(), newest.received_at.as_str()),
            ("xendit", iso_seconds(T0 + 3).as_str())
        );
    }

    /// Events are filtered by outcome, order and the time they were received (at or after it),
    /// each alone and together with the others and the provider, newest first up to the limit.
    pub async fn events_are_filtered_by_outcome_order_and_time_together(t: Ctx) {
        let at = |secs| T0 + secs;
        t.record(paid("evt_1", "ord_1")).await; // T0, processed
        t.advance(10);
        t.record(ev("evt_2").kind("customer.created").order("ord_2"))
            .await; // T0 + 10, ignored
        t.advance(10);
        assert_eq!(
            t.record(ev("evt_3").order("ord_1").to(Pending)).await,
            Outcome::Stale
        ); // T0 + 20
        t.advance(10);
        t.record(paid("evt_4", "ord_2").provider("midtrans")).await; // T0 + 30, processed
        t.advance(10);
        let dispute = ev("evt_5").via_payment("pi_9").to(Disputed).no_amount();
        assert_eq!(t.record(dispute).await, Outcome::Parked); // T0 + 40, no order yet

        let ids = |adjust: &dyn Fn(&mut EventQuery)| -> Vec<String> {
            let mut query = EventQuery::newest(10);
            adjust(&mut query);
            t.ops
                .events(&query)
                .unwrap()
                .into_iter()
                .map(|e| e.event_id)
                .collect()
        };
        assert_eq!(
            ids(&|q| q.outcome = Some(Outcome::Processed)),
            ["evt_4", "evt_1"]
        );
        assert_eq!(ids(&|q| q.outcome = Some(Outcome::Stale)), ["evt_3"]);
        assert_eq!(ids(&|q| q.outcome = Some(Outcome::Ignored)), ["evt_2"]);
        assert_eq!(ids(&|q| q.outcome = Some(Outcome::Parked)), ["evt_5"]);
        assert!(ids(&|q| q.outcome = Some(Outcome::Reversed)).is_empty());
        assert_eq!(
            ids(&|q| q.order_id = Some("ord_1".into())),
            ["evt_3", "evt_1"]
        );
        assert_eq!(
            ids(&|q| q.order_id = Some("ord_2".into())),
            ["evt_4", "evt_2"]
        );
        assert!(
            ids(&|q| q.order_id = Some("ord_".into())).is_empty(),
            "no prefix match"
        );
        assert_eq!(
            ids(&|q| q.since_unix = Some(at(20))),
            ["evt_5", "evt_4", "evt_3"]
        );
        assert_eq!(ids(&|q| q.since_unix = Some(at(21))), ["evt_5", "evt_4"]);
        assert!(ids(&|q| q.since_unix = Some(at(41))).is_empty());
        assert_eq!(
            ids(&|q| {
                q.order_id = Some("ord_1".into());
                q.outcome = Some(Outcome::Processed);
            }),
            ["evt_1"]
        );
        assert_eq!(
            ids(&|q| {
                q.outcome = Some(Outcome::Processed);
                q.since_unix = Some(at(1));
            }),
            ["evt_4"]
        );
        assert_eq!(
            ids(&|q| {
                q.provider = Some("stripe".into());
                q.order_id = Some("ord_2".into());
            }),
            ["evt_2"]
        );
        assert_eq!(
            ids(&|q| {
                q.outcome = Some(Outcome::Processed);
                q.limit = 1;
            }),
            ["evt_4"]
        );
    }

    /// The console's event list: by type, received before a time, and a page after another,
    /// each alone and with the other filters; a page's `before` is the last row's place, so the
    /// pages together are the whole listing, each row once.
    pub async fn events_are_filtered_by_type_and_end_time_and_paged_by_arrival(t: Ctx) {
        let at = |secs| T0 + secs;
        t.record(paid("evt_1", "ord_1")).await; // T0
        t.advance(10);
        t.record(ev("evt_2").kind("customer.created").order("ord_2"))
            .await; // T0 + 10
        t.advance(10);
        t.record(paid("evt_3", "ord_3")).await; // T0 + 20
        t.advance(10);
        t.record(paid("evt_4", "ord_4").provider("midtrans")).await; // T0 + 30
        let list = |adjust: &dyn Fn(&mut EventQuery)| -> Vec<(String, i64)> {
            let mut query = EventQuery::newest(10);
            adjust(&mut query);
            t.ops
                .events(&query)
                .unwrap()
                .into_iter()
                .map(|e| (e.event_id, e.seq))
                .collect()
        };
        let ids = |adjust: &dyn Fn(&mut EventQuery)| -> Vec<String> {
            list(adjust).into_iter().map(|(id, _)| id).collect()
        };
        assert_eq!(
            ids(&|q| q.event_type = Some("customer.created".into())),
            ["evt_2"]
        );
        let paid_type = t.ops.events(&EventQuery::newest(10)).unwrap()[3]
            .event_type
            .clone();
        assert_eq!(
            ids(&|q| q.event_type = Some(paid_type.clone())),
            ["evt_4", "evt_3", "evt_1"]
        );
        let prefix: String = paid_type.chars().take(3).collect();
        assert!(
            ids(&|q| q.event_type = Some(prefix.clone())).is_empty(),
            "the type matches whole"
        );
        assert_eq!(ids(&|q| q.until_unix = Some(at(20))), ["evt_2", "evt_1"]);
        assert!(ids(&|q| q.until_unix = Some(at(0))).is_empty());
        assert_eq!(
            ids(&|q| {
                q.since_unix = Some(at(10));
                q.until_unix = Some(at(30));
            }),
            ["evt_3", "evt_2"]
        );
        let mut pages = Vec::new();
        let mut before = None;
        loop {
            let page = list(&|q| {
                q.limit = 3;
                q.before_seq = before;
            });
            if page.is_empty() {
                break;
            }
            before = page.last().map(|(_, seq)| *seq);
            pages.push(page.into_iter().map(|(id, _)| id).collect::<Vec<_>>());
        }
        assert_eq!(pages, [vec!["evt_4", "evt_3", "evt_2"], vec!["evt_1"]]);
        assert_eq!(
            ids(&|q| {
                q.provider = Some("stripe".into());
                q.before_seq = before;
            }),
            Vec::<String>::new()
        );
    }

    /// The console's overview: the events received since a time, by provider and outcome.
    pub async fn events_are_counted_by_provider_and_outcome_since_a_time(t: Ctx) {
        assert!(t.ops.event_counts(T0 - 3600).unwrap().is_empty());
        t.record(paid("evt_1", "ord_1")).await; // T0
        t.advance(10);
        t.record(paid("evt_2", "ord_2")).await; // T0 + 10
        t.record(ev("evt_3").kind("customer.created").order("ord_2"))
            .await;
        t.record(paid("evt_4", "ord_4").provider("midtrans")).await;
        let counts = |since| -> Vec<(String, String, i64)> {
            t.ops
                .event_counts(since)
                .unwrap()
                .into_iter()
                .map(|c| (c.provider, c.outcome, c.count))
                .collect()
        };
        let row = |p: &str, o: &str, n| (p.to_owned(), o.to_owned(), n);
        assert_eq!(
            counts(T0),
            [
                row("midtrans", "processed", 1),
                row("stripe", "ignored", 1),
                row("stripe", "processed", 2),
            ]
        );
        assert_eq!(
            counts(T0 + 1),
            [
                row("midtrans", "processed", 1),
                row("stripe", "ignored", 1),
                row("stripe", "processed", 1),
            ]
        );
        assert!(counts(T0 + 11).is_empty());
    }

    /// An operator's skip of a pending or dead email: never claimed again, its error saying who
    /// skipped it; one being sent under a live lease, and one sent already, left alone.
    pub async fn an_email_skipped_by_an_operator_is_never_claimed_unless_a_relay_holds_it(t: Ctx) {
        let ids = receipts(&t, 4).await;
        assert_eq!(t.claim("relay-a", 2).await.len(), 2); // ids[0], ids[1] leased
        t.advance(1);
        assert_eq!(
            t.results(
                "relay-a",
                &[(ids[0], SendOutcome::Sent), (ids[1], failed(None))]
            )
            .await,
            [true, true]
        ); // ids[0] sent, ids[1] dead
        assert_eq!(t.claim("relay-b", 1).await.len(), 1); // ids[2] leased
        let now = t.now_ms();
        assert_eq!(
            t.ops.skip_email(ids[1], now).unwrap(),
            Skipped::Skipped { was: "dead".into() }
        );
        assert_eq!(
            t.ops.skip_email(ids[3], now).unwrap(),
            Skipped::Skipped {
                was: "pending".into()
            }
        );
        assert!(matches!(
            t.ops.skip_email(ids[2], now).unwrap(),
            Skipped::Leased { owner, .. } if owner == "relay-b"
        ));
        assert_eq!(
            t.ops.skip_email(ids[0], now).unwrap(),
            Skipped::Finished {
                status: "sent".into()
            }
        );
        assert_eq!(t.ops.skip_email(999_999, now).unwrap(), Skipped::Missing);
        for id in [ids[1], ids[3]] {
            let row = t.row(id);
            assert_eq!(row.status, "skipped");
            assert!(
                row.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("skipped by an operator")),
                "{row:?}"
            );
        }
        t.advance(7 * 24 * 3600);
        let claimed: Vec<i64> = t
            .claim("relay-c", 10)
            .await
            .into_iter()
            .map(|c| c.id)
            .collect();
        assert_eq!(claimed, [ids[2]], "only the leased row, its lease run out");
    }

    /// `outbox_attempts`: each result recorded while the relay held the row, oldest first, with
    /// the relay and the error; a result the lease no longer covered is not kept, as it changed
    /// nothing. Kept per outbox: a forward's id is not an email's.
    pub async fn every_result_a_relay_records_is_kept_in_order_with_its_relay_and_error(t: Ctx) {
        let ids = receipts(&t, 2).await;
        assert!(t
            .ops
            .outbox_attempts(OutboxKind::Email, ids[0])
            .unwrap()
            .is_empty());
        t.claim("relay-a", 10).await;
        t.advance(1);
        let first = iso_millis(t.now_ms());
        let retry_at = t.now_ms() + 60_000;
        assert_eq!(
            t.results(
                "relay-a",
                &[
                    (ids[0], failed(Some(retry_at))),
                    (ids[1], untried(Some(retry_at)))
                ]
            )
            .await,
            [true, true]
        );
        t.advance(61);
        assert_eq!(t.claim("relay-b", 10).await.len(), 2);
        let second = iso_millis(t.now_ms());
        assert_eq!(
            t.results(
                "relay-b",
                &[(ids[0], SendOutcome::Sent), (ids[1], failed(None))]
            )
            .await,
            [true, true]
        );
        // relay-a's lease is long gone: its late result changes nothing and is not kept.
        assert_eq!(
            t.results("relay-a", &[(ids[0], failed(None))]).await,
            [false]
        );
        let kept = |id| -> Vec<(String, String, String, Option<String>)> {
            t.ops
                .outbox_attempts(OutboxKind::Email, id)
                .unwrap()
                .into_iter()
                .map(|a| (a.at, a.relay, a.result, a.error))
                .collect()
        };
        let error = Some("550 mailbox unavailable".to_owned());
        assert_eq!(
            kept(ids[0]),
            [
                (
                    first.clone(),
                    "relay-a".into(),
                    "failed".into(),
                    error.clone()
                ),
                (second.clone(), "relay-b".into(), "sent".into(), None),
            ]
        );
        let unavailable = match untried(None) {
            SendOutcome::Untried { error, .. } => Some(error),
            _ => unreachable!(),
        };
        assert_eq!(
            kept(ids[1]),
            [
                (first, "relay-a".into(), "unavailable".into(), unavailable),
                (second, "relay-b".into(), "dead".into(), error),
            ]
        );
        assert!(t
            .ops
            .outbox_attempts(OutboxKind::Forward, ids[0])
            .unwrap()
            .is_empty());
    }

    /// The headers the route kept with a delivery are stored with its claim and read back
    /// exactly; an event without them reads none.
    pub async fn an_events_kept_headers_are_stored_with_it_and_read_back(t: Ctx) {
        let headers = r#"{"content-type":"application/json","user-agent":"Stripe/1.0 <b>\u202e"}"#;
        t.record(paid("evt_1", "ord_1").headers(headers)).await;
        t.record(paid("evt_2", "ord_2")).await;
        assert_eq!(
            t.claim_of("stripe", "evt_1").headers.as_deref(),
            Some(headers)
        );
        assert_eq!(t.claim_of("stripe", "evt_2").headers, None);
    }

    /// A console logout is seen by every connection until its session would have ended anyway;
    /// a later logout forgets those past their end. Logging out twice is one logout.
    pub async fn a_console_logout_holds_until_its_session_would_have_ended(t: Ctx) {
        assert!(!t.ops.console_session_ended("session-a").unwrap());
        t.ops
            .end_console_session("session-a", T0 + 100, T0)
            .unwrap();
        t.ops
            .end_console_session("session-a", T0 + 100, T0 + 1)
            .unwrap();
        assert!(t.ops.console_session_ended("session-a").unwrap());
        assert!(!t.ops.console_session_ended("session-b").unwrap());
        t.ops
            .end_console_session("session-b", T0 + 500, T0 + 100)
            .unwrap();
        assert!(
            !t.ops.console_session_ended("session-a").unwrap(),
            "forgotten once it would have ended"
        );
        assert!(t.ops.console_session_ended("session-b").unwrap());
    }

    /// A delivery claimed again once its retention ran out is the newest arrival, and is
    /// listed first, not where its expired claim was.
    pub async fn an_event_claimed_again_after_its_retention_is_listed_as_the_newest(t: Ctx) {
        let short = || ev("evt_1").order("ord_1").to(Pending).retention(60);
        t.record(short()).await;
        t.advance(1);
        t.record(ev("evt_2").order("ord_1").to(Pending)).await;
        t.advance(60);
        assert_eq!(t.record(short()).await, Outcome::Processed);

        let listed: Vec<(String, String)> = t
            .ops
            .events(&EventQuery::newest(10))
            .unwrap()
            .into_iter()
            .map(|e| (e.event_id, e.received_at))
            .collect();
        assert_eq!(
            listed,
            [
                ("evt_1".to_owned(), iso_seconds(T0 + 61)),
                ("evt_2".to_owned(), iso_seconds(T0 + 1)),
            ]
        );
    }

    /// The outbox is listed newest first, optionally of one status, up to the limit.
    pub async fn the_outbox_is_listed_newest_first_by_status(t: Ctx) {
        let ids = receipts(&t, 3).await;
        t.claim("relay-a", 1).await;
        t.results("relay-a", &[(ids[0], SendOutcome::Sent)]).await;
        let listed = |status: Option<&str>, limit| -> Vec<i64> {
            let query = OutboxQuery {
                status: status.map(str::to_owned),
                ..OutboxQuery::newest(limit)
            };
            t.ops
                .outbox(&query)
                .unwrap()
                .into_iter()
                .map(|r| r.id)
                .collect()
        };
        assert_eq!(listed(None, 10), [ids[2], ids[1], ids[0]]);
        assert_eq!(listed(None, 1), [ids[2]]);
        assert_eq!(listed(Some("pending"), 10), [ids[2], ids[1]]);
        assert_eq!(listed(Some("sent"), 10), [ids[0]]);
        assert!(listed(Some("dead"), 10).is_empty());
    }

    /// Outbox rows are filtered by status, order and the time they were queued (at or after
    /// it), each alone and together, newest first up to the limit.
    pub async fn the_outbox_is_filtered_by_status_order_and_time_together(t: Ctx) {
        let first = receipts(&t, 2).await; // ord_0 and ord_1 at T0
        t.advance(60);
        t.record(paid("evt_later", "ord_1").to(Refunded).refunded(1500))
            .await; // a refund notice for ord_1 at T0 + 60
        t.claim("relay-a", 1).await;
        t.results("relay-a", &[(first[0], SendOutcome::Sent)]).await;
        let notice = t.emails("ord_1")[1].id;

        let ids = |adjust: &dyn Fn(&mut OutboxQuery)| -> Vec<i64> {
            let mut query = OutboxQuery::newest(10);
            adjust(&mut query);
            t.ops
                .outbox(&query)
                .unwrap()
                .into_iter()
                .map(|r| r.id)
                .collect()
        };
        assert_eq!(
            ids(&|q| q.order_id = Some("ord_1".into())),
            [notice, first[1]]
        );
        assert_eq!(ids(&|q| q.since_unix = Some(T0 + 60)), [notice]);
        assert_eq!(
            ids(&|q| q.since_unix = Some(T0)),
            [notice, first[1], first[0]]
        );
        assert_eq!(
            ids(&|q| {
                q.status = Some("pending".into());
                q.order_id = Some("ord_1".into());
                q.since_unix = Some(T0 + 1);
            }),
            [notice]
        );
        assert_eq!(
            ids(&|q| {
                q.status = Some("sent".into());
                q.order_id = Some("ord_1".into());
            }),
            Vec::<i64>::new()
        );
        assert_eq!(
            ids(&|q| {
                q.order_id = Some("ord_1".into());
                q.limit = 1;
            }),
            [notice]
        );
    }

    pub async fn the_store_answers_its_health_check(t: Ctx) {
        t.store.check_health().await.expect("healthy when empty");
        t.record(paid("evt_1", "ord_1")).await;
        t.store.check_health().await.expect("healthy");
    }

    /// The store's counters: every delivery counts (duplicates too), each write commits in a
    /// transaction, relay claims and results count with their rows, and reads count nothing.
    pub async fn stats_count_transactions_deliveries_and_relay_work(t: Ctx) {
        let start = t.store.stats().writer;
        t.record(paid("evt_1", "ord_1")).await;
        t.record(paid("evt_2", "ord_2")).await;
        t.record(paid("evt_1", "ord_1")).await;
        let recorded = t.store.stats().writer;
        assert_eq!(recorded.deliveries - start.deliveries, 3);
        assert!(
            recorded.transactions > start.transactions,
            "{start:?} {recorded:?}"
        );

        let claimed = t.claim("relay-a", 10).await;
        let after_claim = t.store.stats().writer;
        assert_eq!(after_claim.outbox_claims - recorded.outbox_claims, 1);
        assert_eq!(
            after_claim.outbox_claimed_rows - recorded.outbox_claimed_rows,
            2
        );
        let results: Vec<(i64, SendOutcome)> =
            claimed.iter().map(|e| (e.id, SendOutcome::Sent)).collect();
        t.results("relay-a", &results).await;
        let after_results = t.store.stats().writer;
        assert_eq!(
            after_results.outbox_result_batches - after_claim.outbox_result_batches,
            1
        );
        assert_eq!(after_results.outbox_results - after_claim.outbox_results, 2);
        assert!(after_results.transactions > after_claim.transactions);
        assert_eq!(after_results.deliveries, recorded.deliveries);

        t.order("ord_1").await;
        t.all_orders().await;
        t.store.check_health().await.unwrap();
        assert_eq!(t.store.stats().writer, after_results);
    }

    /// The load generator's check: the events, orders and emails of the run whose ids contain
    /// its marker, and nothing else.
    pub async fn run_counts_count_the_rows_of_one_marker(t: Ctx) {
        t.record(paid("evt_run7_1", "ord_run7_1")).await;
        t.record(paid("evt_run7_2", "ord_run7_2")).await;
        t.record(ev("evt_run7_3").order("ord_run7_3").to(Pending))
            .await;
        t.record(paid("evt_other", "ord_other")).await;
        let counts = t.ops.run_counts("run7").unwrap();
        assert_eq!(
            (
                counts.events,
                counts.orders,
                counts.emails,
                counts.orders_emailed
            ),
            (3, 3, 2, 2)
        );
        let none = t.ops.run_counts("run8").unwrap();
        assert_eq!((none.events, none.orders, none.emails), (0, 0, 0));
    }

    // --- the load generator's rows ----------------------------------------------------------

    /// Real orders are those of no run: `bench_{hex}_{hex or decimal}` is a run's, in that
    /// case; a shop's `bench_deluxe_1` or `BENCH_1a_0` is not.
    pub async fn orders_outside_runs_are_every_order_but_the_load_generators(t: Ctx) {
        let none = t.ops.orders_outside_runs(5).unwrap();
        assert_eq!((none.count, none.examples.len()), (0, 0));
        for (event, order) in [
            ("evt_bench_1a_0", "bench_1a_0"),
            ("evt_bench_1a_00000000000000ff", "bench_1a_00000000000000ff"),
            ("evt_1", "ord_1"),
            ("evt_2", "bench_deluxe_1"),
            ("evt_3", "BENCH_1a_0"),
            ("evt_4", "bench__1"),
            ("evt_5", "bench_1a_"),
        ] {
            t.record(paid(event, order)).await;
        }
        let outside = t.ops.orders_outside_runs(2).unwrap();
        assert_eq!(outside.count, 5);
        assert_eq!(outside.examples, ["BENCH_1a_0", "bench_1a_"]);
    }

    /// Every row of the run goes: its events (one that named no order too), orders,
    /// transitions, payments and emails, and the emails' keys come back for their files. A
    /// run whose id begins with this one's, and a real order, keep every row.
    pub async fn deleting_a_run_removes_every_row_it_wrote_and_nothing_else(t: Ctx) {
        t.record(paid("evt_bench_7f_0", "bench_7f_0").payment("pi_bench_7f_0"))
            .await;
        t.record(paid("evt_bench_7f_1", "bench_7f_1")).await;
        let refund = ev("evt_bench_7f_0r")
            .kind("charge.refunded")
            .order("bench_7f_0")
            .payment("pi_bench_7f_0")
            .to(Refunded)
            .refunded(1500);
        assert_eq!(t.record(refund).await, Outcome::Processed);
        assert_eq!(t.record(ev("evt_bench_7f_9")).await, Outcome::Ignored);
        t.record(paid("evt_bench_7f0_0", "bench_7f0_0").payment("pi_bench_7f0_0"))
            .await;
        t.record(paid("evt_1", "ord_1").payment("pi_1")).await;
        let emails: Vec<(String, String)> = t
            .outbox()
            .into_iter()
            .filter(|row| row.order_id.starts_with("bench_7f_"))
            .map(|row| (row.idempotency_key, row.order_id))
            .collect();
        assert_eq!(emails.len(), 3);
        let others = json!({
            "real": [t.order("ord_1").await, t.emails("ord_1"), t.claim_of("stripe", "evt_1")],
            "run": [t.order("bench_7f0_0").await, t.emails("bench_7f0_0")],
        });

        let run = RunMarker::new("7f").unwrap();
        let RunDeletion::Deleted(deleted) = t.ops.delete_run(&run, t.now_ms()).unwrap() else {
            panic!("no email was leased");
        };
        assert_eq!(
            (
                deleted.events,
                deleted.orders,
                deleted.transitions,
                deleted.payments
            ),
            // Each of its orders had a payment.
            (4, 2, 3, 2)
        );
        let mut returned: Vec<(String, String)> = deleted
            .emails
            .into_iter()
            .map(|e| (e.idempotency_key, e.order_id))
            .collect();
        returned.sort();
        let mut emails = emails;
        emails.sort();
        assert_eq!(returned, emails);

        let of_run = |id: &str| id.contains("bench_7f_");
        let events = t.ops.events(&EventQuery::newest(ALL)).unwrap();
        assert!(!events.iter().any(|e| of_run(&e.event_id)), "{events:?}");
        let orders = t.all_orders().await;
        assert!(!orders.iter().any(|o| of_run(&o.order_id)), "{orders:?}");
        assert!(!t.outbox().iter().any(|row| of_run(&row.order_id)));
        assert_eq!(
            json!({
                "real": [t.order("ord_1").await, t.emails("ord_1"), t.claim_of("stripe", "evt_1")],
                "run": [t.order("bench_7f0_0").await, t.emails("bench_7f0_0")],
            }),
            others
        );
        // The payment of the other run still leads to its order.
        let charge = ev("evt_bench_7f0_0r")
            .kind("charge.refunded")
            .via_payment("pi_bench_7f0_0")
            .to(Refunded)
            .refunded(1500);
        assert_eq!(t.record(charge).await, Outcome::Processed);

        let again = t.ops.delete_run(&run, t.now_ms()).unwrap();
        assert_eq!(again, RunDeletion::Deleted(Default::default()));
    }

    /// A relay holding one of the run's emails may be writing it now: nothing is deleted until
    /// it records its result or its lease runs out.
    pub async fn a_run_is_not_deleted_while_a_relay_holds_one_of_its_emails(t: Ctx) {
        t.record(paid("evt_bench_5_0", "bench_5_0")).await;
        t.record(paid("evt_bench_5_1", "bench_5_1")).await;
        let run = RunMarker::new("5").unwrap();
        let claimed = t.claim("relay-a", 1).await;
        assert_eq!(claimed.len(), 1);
        let before = t.snapshot().await;
        assert_eq!(
            t.ops.delete_run(&run, t.now_ms()).unwrap(),
            RunDeletion::Leased { emails: 1 }
        );
        assert_eq!(t.snapshot().await, before);

        // Sent: the lease is over.
        t.results("relay-a", &[(claimed[0].id, SendOutcome::Sent)])
            .await;
        let claimed = t.claim("relay-a", 1).await;
        assert_eq!(claimed.len(), 1);
        assert!(matches!(
            t.ops.delete_run(&run, t.now_ms()).unwrap(),
            RunDeletion::Leased { emails: 1 }
        ));
        // Or the relay died holding it: the lease runs out.
        t.advance((LEASE_MS / 1000) as u64);
        let RunDeletion::Deleted(deleted) = t.ops.delete_run(&run, t.now_ms()).unwrap() else {
            panic!("the lease ran out");
        };
        assert_eq!((deleted.orders, deleted.emails.len()), (2, 2));
        // The relay that overran its lease records nothing for a row that is gone.
        assert_eq!(
            t.results("relay-a", &[(claimed[0].id, SendOutcome::Sent)])
                .await,
            [false]
        );
        assert!(t.claim("relay-b", 10).await.is_empty());
    }

    // --- the operator's override ---------------------------------------------------------------

    /// An operator may set any status, backwards too; each call returns the previous one.
    pub async fn an_operator_can_set_any_status_and_gets_the_previous_one(t: Ctx) {
        t.record(paid("evt_1", "ord_1")).await;
        t.advance(30);
        let previous = t
            .ops
            .set_status_by_operator("ord_1", &by_operator(Pending), t.now())
            .unwrap();
        assert_eq!(previous, Paid);
        let order = t.order("ord_1").await.unwrap();
        assert_eq!(order.status, "pending");
        assert_eq!(order.updated_at, iso_seconds(T0 + 30));
        for (next, before) in [(Cancelled, Pending), (NeedsReview, Cancelled)] {
            assert_eq!(
                t.ops
                    .set_status_by_operator("ord_1", &by_operator(next), t.now())
                    .unwrap(),
                before
            );
            assert_eq!(t.status("ord_1").await, next);
        }
        assert_eq!(t.templates("ord_1"), ["receipt"], "these carry no notice");
    }

    pub async fn setting_the_status_of_a_missing_order_is_no_such_order(t: Ctx) {
        let refused = t
            .ops
            .set_status_by_operator("ord_missing", &by_operator(Paid), t.now());
        assert!(
            matches!(&refused, Err(SetStatusError::NoSuchOrder(id)) if id == "ord_missing"),
            "{refused:?}"
        );
        assert_eq!(t.order("ord_missing").await, None);
        assert!(t.outbox().is_empty());
    }

    /// A mismatched payment took the customer's money: its receipt goes out at once, for what
    /// was paid, to the shop's address for the order (not the payer's the payment reported);
    /// settling the review as paid queues no second one.
    pub async fn settling_a_review_as_paid_queues_the_receipt_for_what_was_paid(t: Ctx) {
        t.create_api_order(new_order("ord_1")).await;
        let less = paid("evt_1", "ord_1").paid(1000);
        assert_eq!(t.record(less).await, Outcome::AmountMismatch);
        assert_eq!(t.templates("ord_1"), ["receipt"]);

        let previous = t
            .ops
            .set_status_by_operator("ord_1", &by_operator(Paid), t.now())
            .unwrap();
        assert_eq!(previous, NeedsReview);
        assert_eq!(t.status("ord_1").await, Paid);
        let emails = t.emails("ord_1");
        assert_eq!(emails.len(), 1, "{emails:?}");
        assert_eq!(emails[0].template, "receipt");
        assert_eq!(emails[0].recipient.as_deref(), Some("budi@toko.example"));
        assert_eq!(params(&emails[0])["amount"], json!(1000));
        assert_eq!(params(&emails[0])["status"], json!("paid"));
    }

    /// A change to the status the order has is no change: refused, with nothing recorded and
    /// no second notice.
    pub async fn an_operator_setting_the_status_the_order_has_is_refused(t: Ctx) {
        t.record(paid("evt_1", "ord_1")).await;
        let refused = t
            .ops
            .set_status_by_operator("ord_1", &by_operator(Paid), t.now());
        assert!(
            matches!(
                &refused,
                Err(SetStatusError::Unchanged { status: Paid, .. })
            ),
            "{refused:?}"
        );
        assert_eq!(t.templates("ord_1"), ["receipt"]);
        let history = t.order("ord_1").await.unwrap().history.unwrap();
        assert_eq!(history.len(), 1, "{history:?}");
    }

    /// The history of an order says when, from what, to what, and by whom each change was
    /// made: a provider's event, the API's client, an operator with the reason given.
    /// `GET /changes`: every change (a webhook's, the API's, an operator's) once, in the order
    /// they committed, numbered per order, with the order's amount, currency and metadata;
    /// paged by cursor, the pages join into the whole; a duplicate adds nothing; a change
    /// committed later comes after the last cursor.
    pub async fn the_change_feed_serves_every_change_once_in_commit_order_after_a_cursor(t: Ctx) {
        assert!(t.store.changes(None, ALL).await.unwrap().is_empty());
        t.create_api_order(new_order("ord_api")).await;
        t.advance(10);
        t.record(paid("evt_1", "ord_hook")).await;
        t.record(paid("evt_2", "ord_api")).await;
        assert_eq!(t.record(paid("evt_2", "ord_api")).await, Outcome::Duplicate);
        t.advance(10);
        let change = OperatorChange {
            status: Refunded,
            operator: "ana".into(),
            reason: "refunded by bank transfer".into(),
        };
        t.ops
            .set_status_by_operator("ord_hook", &change, t.now())
            .unwrap();

        let all = t.store.changes(None, ALL).await.unwrap();
        let rows: Vec<_> = all
            .iter()
            .map(|c| {
                (
                    c.order_id.as_str(),
                    c.sequence,
                    c.previous_status.as_deref(),
                    c.status.as_str(),
                    c.kind.as_str(),
                    c.changed_by.as_str(),
                    c.provider_event_id.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("ord_api", 1, None, "pending", "order.pending", "api", None),
                (
                    "ord_hook",
                    1,
                    None,
                    "paid",
                    "order.paid",
                    "stripe",
                    Some("evt_1")
                ),
                (
                    "ord_api",
                    2,
                    Some("pending"),
                    "paid",
                    "order.paid",
                    "stripe",
                    Some("evt_2")
                ),
                (
                    "ord_hook",
                    2,
                    Some("paid"),
                    "refunded",
                    "order.refunded",
                    "operator",
                    None
                ),
            ]
        );
        let api = &all[0];
        assert_eq!(
            (api.amount, api.currency.as_deref(), api.provider.as_str()),
            (Some(1500), Some("usd"), "stripe")
        );
        assert_eq!(api.metadata, Some(json!({"cart": "c-1"})));
        assert_eq!(all[1].metadata, None);
        assert_eq!(all[0].changed_at, iso_seconds(T0));
        assert_eq!(all[3].changed_at, iso_seconds(T0 + 20));
        let ids: std::collections::HashSet<_> = all.iter().map(|c| c.id.clone()).collect();
        assert_eq!(ids.len(), all.len(), "each change has its own id");

        // Paged one by one from the start, the pages join into the whole.
        let mut paged = Vec::new();
        let mut after = None;
        loop {
            let page = t.store.changes(after, 1).await.unwrap();
            let Some(last) = page.last() else { break };
            after = Some(last.cursor);
            paged.extend(page);
        }
        assert_eq!(paged, all);
        // A change committed later comes after the last cursor, and nothing before it again.
        t.record(paid("evt_3", "ord_late")).await;
        let later = t.store.changes(after, ALL).await.unwrap();
        assert_eq!(
            later
                .iter()
                .map(|c| c.order_id.as_str())
                .collect::<Vec<_>>(),
            ["ord_late"]
        );
        assert!(later[0].cursor > after.unwrap());
    }

    pub async fn an_orders_history_names_who_made_each_change_and_why(t: Ctx) {
        t.create_api_order(new_order("ord_1")).await;
        t.advance(10);
        t.record(paid("evt_1", "ord_1")).await;
        t.advance(10);
        let change = OperatorChange {
            status: Refunded,
            operator: "ana".into(),
            reason: "refunded by bank transfer, ticket 42".into(),
        };
        t.ops
            .set_status_by_operator("ord_1", &change, t.now())
            .unwrap();
        let history = t.order("ord_1").await.unwrap().history.unwrap();
        let rows: Vec<_> = history
            .iter()
            .map(|h| {
                (
                    h.changed_at.clone(),
                    h.from_status.as_deref(),
                    h.to_status.as_str(),
                    h.provider.as_str(),
                    h.actor.as_deref(),
                    h.reason.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                (iso_seconds(T0), None, "pending", "api", Some("shop"), None),
                (
                    iso_seconds(T0 + 10),
                    Some("pending"),
                    "paid",
                    "stripe",
                    None,
                    None
                ),
                (
                    iso_seconds(T0 + 20),
                    Some("paid"),
                    "refunded",
                    "operator",
                    Some("ana"),
                    Some("refunded by bank transfer, ticket 42")
                ),
            ]
        );
        assert_eq!(history[1].event_id, "evt_1");
        assert_eq!(t.ops.transitions("ord_1").unwrap(), history);
    }

    /// `order_transitions` holds one row per change of status, oldest first, with the refunded
    /// amount after it and the event that made it; an event that changed nothing adds none.
    pub async fn an_orders_audit_trail_is_every_change_oldest_first(t: Ctx) {
        assert_eq!(t.ops.transitions("ord_1").unwrap(), []);
        t.record(ev("evt_1").order("ord_1").to(Pending)).await;
        t.advance(5);
        t.record(paid("evt_2", "ord_1")).await;
        t.advance(5);
        // Paid again: processed, but no change of status.
        assert_eq!(t.record(paid("evt_3", "ord_1")).await, Outcome::Processed);
        t.record(ev("evt_4").order("ord_1").refunded(500)).await;
        t.record(ev("evt_5").order("ord_2").to(Pending)).await;
        let trail: Vec<_> = t
            .ops
            .transitions("ord_1")
            .unwrap()
            .into_iter()
            .map(|h| {
                (
                    h.changed_at,
                    h.from_status,
                    h.to_status,
                    h.refunded_amount,
                    h.event_id,
                )
            })
            .collect();
        assert_eq!(
            trail,
            [
                (iso_seconds(T0), None, "pending".into(), 0, "evt_1".into()),
                (
                    iso_seconds(T0 + 5),
                    Some("pending".into()),
                    "paid".into(),
                    0,
                    "evt_2".into()
                ),
                (
                    iso_seconds(T0 + 10),
                    Some("paid".into()),
                    "partially_refunded".into(),
                    500,
                    "evt_4".into()
                ),
            ]
        );
    }

    // --- an error means nothing was committed ---------------------------------------------

    /// A delivery whose transaction fails to commit gets an error (the provider is answered
    /// 503) and leaves no claim, no order change, no transition and no email: sent again, it
    /// is a new event, applied once.
    pub async fn a_delivery_whose_commit_fails_leaves_nothing_and_is_new_when_sent_again(t: Ctx) {
        t.record(ev("evt_1").order("ord_1").to(Pending)).await;
        t.advance(5);
        let before = t.snapshot().await;
        let trail = t.ops.transitions("ord_1").unwrap();

        t.faults.fail_next(1);
        let event = paid("evt_2", "ord_1");
        let payload = payload_of(&event.0);
        let failed = t.store.record(event.0, payload).await;
        assert!(failed.is_err(), "{failed:?}");
        assert_eq!(t.snapshot().await, before);
        assert_eq!(t.ops.transitions("ord_1").unwrap(), trail);
        assert!(t.ops.find_events("evt_2", None).unwrap().is_empty());

        assert_eq!(t.record(paid("evt_2", "ord_1")).await, Outcome::Processed);
        assert_eq!(t.status("ord_1").await, Paid);
        assert_eq!(t.templates("ord_1"), ["receipt"]);
        assert_eq!(t.ops.transitions("ord_1").unwrap().len(), 2);
    }

    /// An order request whose transaction fails to commit keeps neither its key nor its order:
    /// the same request again runs afresh (201), not as a replay of an answer never given.
    pub async fn an_order_request_whose_commit_fails_keeps_no_key_and_no_order(t: Ctx) {
        t.faults.fail_next(1);
        let failed = t
            .store
            .create_order(create("shop", "key-1", "fp", new_order("ord_api")))
            .await;
        assert!(failed.is_err(), "{failed:?}");
        assert_eq!(t.order("ord_api").await, None);
        assert_eq!(t.ops.transitions("ord_api").unwrap(), []);

        let outcome = t
            .create(create("shop", "key-1", "fp", new_order("ord_api")))
            .await;
        assert!(
            matches!(&outcome, IdempotentOutcome::Fresh(r) if r.status == 201),
            "{outcome:?}"
        );
        assert_eq!(t.all_orders().await.len(), 1);
    }

    /// A relay's claim that fails to commit leases nothing (another relay can claim the rows at
    /// once), and its results that fail to commit leave the rows as they were, still leased to
    /// it, so that recording them again succeeds.
    pub async fn a_claim_or_results_whose_commit_fails_change_no_row(t: Ctx) {
        let ids = receipts(&t, 2).await;
        let due = t.snapshot().await;
        t.faults.fail_next(1);
        let failed = t
            .store
            .claim_outbox(ClaimRequest {
                owner: "relay-a".into(),
                lease_ms: LEASE_MS,
                limit: 10,
                outbox: sekali::store::OutboxKind::Email,
            })
            .await;
        assert!(failed.is_err(), "{failed:?}");
        assert_eq!(t.snapshot().await, due);

        let claimed: Vec<i64> = t.claim("relay-b", 10).await.iter().map(|e| e.id).collect();
        assert_eq!(claimed, ids);
        let leased = t.snapshot().await;
        t.faults.fail_next(1);
        let sent: Vec<SendResult> = ids
            .iter()
            .map(|&id| SendResult {
                id,
                outcome: SendOutcome::Sent,
            })
            .collect();
        let failed = t.store.record_outbox_results("relay-b".into(), sent).await;
        assert!(failed.is_err(), "{failed:?}");
        assert_eq!(t.snapshot().await, leased);

        let again: Vec<_> = ids.iter().map(|&id| (id, SendOutcome::Sent)).collect();
        assert_eq!(t.results("relay-b", &again).await, [true, true]);
        assert!(t.outbox().iter().all(|row| row.status == "sent"));
    }

    /// A purge batch whose transaction fails to commit deletes nothing; the next one deletes
    /// what it would have.
    pub async fn a_purge_batch_whose_commit_fails_deletes_nothing(t: Ctx) {
        expired_and_live(&t).await;
        t.advance(60);
        let before = t.snapshot().await;
        t.faults.fail_next(1);
        let failed = t.store.purge_batch(100).await;
        assert!(failed.is_err(), "{failed:?}");
        assert_eq!(t.snapshot().await, before);
        assert_eq!(
            t.store.purge_batch(100).await.unwrap(),
            Purged {
                events: 5,
                idempotency_keys: 3
            }
        );
    }

    // --- forwarding ----------------------------------------------------------------------------

    /// A claim of changes to forward, for `owner`, leased for [`LEASE_MS`].
    async fn claim_changes(t: &Ctx, owner: &str, limit: usize) -> Vec<ClaimedForward> {
        t.store
            .claim_forwards(ClaimRequest {
                owner: owner.into(),
                lease_ms: LEASE_MS,
                limit,
                outbox: OutboxKind::Forward,
            })
            .await
            .expect("the claim commits")
    }

    fn claimed_ids(claimed: &[ClaimedForward]) -> Vec<i64> {
        claimed.iter().map(|c| c.id).collect()
    }

    async fn forward_results(t: &Ctx, owner: &str, results: &[(i64, SendOutcome)]) -> Vec<bool> {
        let results = results
            .iter()
            .map(|(id, outcome)| SendResult {
                id: *id,
                outcome: outcome.clone(),
            })
            .collect();
        t.store
            .record_forward_results(owner.into(), results)
            .await
            .expect("the results commit")
    }

    /// Every forwarding row, oldest first.
    fn forward_rows(t: &Ctx) -> Vec<ForwardRow> {
        let mut rows = t.ops.forwards(&OutboxQuery::newest(ALL)).unwrap();
        rows.reverse();
        rows
    }

    fn forward_row(t: &Ctx, id: i64) -> ForwardRow {
        t.ops
            .forward_row(id)
            .unwrap()
            .unwrap_or_else(|| panic!("no forwarding row {id}"))
            .0
    }

    /// A forwarding row as JSON, to compare whole rows.
    fn forward_json(t: &Ctx, id: i64) -> Value {
        serde_json::to_value(forward_row(t, id)).unwrap()
    }

    /// Forwarding turned on, then four changes: `ord_a`'s first two (created by the API, then
    /// paid by a webhook), `ord_b`'s first (paid by a webhook), `ord_a`'s third (refunded by an
    /// operator). Their rows' ids, in that order.
    async fn changes_of_two_orders(t: &Ctx) -> [i64; 4] {
        assert!(t.ops.set_forwarding(true, t.now()).unwrap());
        t.create_api_order(new_order("ord_a")).await;
        assert_eq!(t.record(paid("evt_a", "ord_a")).await, Outcome::Processed);
        assert_eq!(t.record(paid("evt_b", "ord_b")).await, Outcome::Processed);
        t.ops
            .set_status_by_operator("ord_a", &by_operator(Refunded), t.now())
            .unwrap();
        let rows = forward_rows(t);
        let seen: Vec<(&str, &str, &str)> = rows
            .iter()
            .map(|r| (r.order_id.as_str(), r.kind.as_str(), r.status.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                ("ord_a", "order.pending", "pending"),
                ("ord_a", "order.paid", "pending"),
                ("ord_b", "order.paid", "pending"),
                ("ord_a", "order.refunded", "pending"),
            ]
        );
        [rows[0].id, rows[1].id, rows[2].id, rows[3].id]
    }

    /// A fresh database forwards nothing: changes by a webhook, the API and an operator queue no
    /// row, and a claim finds none. Turning off what is off changes nothing.
    pub async fn with_forwarding_off_no_change_is_queued_to_forward(t: Ctx) {
        t.create_api_order(new_order("ord_api")).await;
        assert_eq!(t.record(paid("evt_1", "ord_api")).await, Outcome::Processed);
        assert_eq!(
            t.record(paid("evt_2", "ord_hook")).await,
            Outcome::Processed
        );
        t.ops
            .set_status_by_operator("ord_hook", &by_operator(Refunded), t.now())
            .unwrap();
        assert_eq!(
            t.store.changes(None, ALL).await.unwrap().len(),
            4,
            "the changes were made"
        );
        assert!(forward_rows(&t).is_empty(), "{:?}", forward_rows(&t));
        assert!(claim_changes(&t, "relay-a", 10).await.is_empty());
        assert!(!t.ops.set_forwarding(false, t.now()).unwrap());
        assert!(forward_rows(&t).is_empty());
    }

    /// Once forwarding is on, every change (a webhook's creating or paying an order, the API's,
    /// an operator's) is queued once, pending, as the message `chg_<id>` whose body is the
    /// change exactly as `GET /changes` serves it; a duplicate delivery queues nothing. Turned
    /// off, new changes are not queued and the queued ones stay; turned on again, they are.
    pub async fn with_forwarding_on_every_change_is_queued_once_as_the_feed_serves_it(t: Ctx) {
        assert_eq!(
            t.record(paid("evt_0", "ord_before")).await,
            Outcome::Processed
        );
        assert!(t.ops.set_forwarding(true, t.now()).unwrap(), "turned on");
        assert!(!t.ops.set_forwarding(true, t.now()).unwrap(), "on already");
        t.create_api_order(new_order("ord_api")).await;
        t.advance(10);
        assert_eq!(
            t.record(paid("evt_1", "ord_hook")).await,
            Outcome::Processed
        );
        assert_eq!(t.record(paid("evt_2", "ord_api")).await, Outcome::Processed);
        assert_eq!(t.record(paid("evt_2", "ord_api")).await, Outcome::Duplicate);
        t.record(ev("evt_3").kind("customer.created")).await; // no change
        t.advance(10);
        t.ops
            .set_status_by_operator("ord_hook", &by_operator(Refunded), t.now())
            .unwrap();

        let feed = t.store.changes(None, ALL).await.unwrap();
        assert_eq!(feed[0].order_id, "ord_before");
        let changes = &feed[1..];
        assert_eq!(changes.len(), 4, "{changes:?}");
        let rows = forward_rows(&t);
        let listed: Vec<_> = rows
            .iter()
            .map(|r| {
                (
                    r.message_id.as_str(),
                    r.order_id.as_str(),
                    r.kind.as_str(),
                    r.status.as_str(),
                    r.attempts,
                    r.created_at.as_str(),
                )
            })
            .collect();
        let expected: Vec<_> = changes
            .iter()
            .map(|c| {
                (
                    c.id.as_str(),
                    c.order_id.as_str(),
                    c.kind.as_str(),
                    "pending",
                    0,
                    c.changed_at.as_str(),
                )
            })
            .collect();
        assert_eq!(listed, expected);
        for row in &rows {
            assert_eq!((&row.lease_owner, &row.sent_at), (&None, &None), "{row:?}");
        }

        // Each message is its change, byte for byte as the feed serialises it.
        let mut sent = Vec::new();
        for _ in 0..changes.len() {
            let claimed = claim_changes(&t, "relay-a", 10).await;
            if claimed.is_empty() {
                break;
            }
            for message in &claimed {
                let change = changes
                    .iter()
                    .find(|c| c.id == message.message_id)
                    .unwrap_or_else(|| panic!("{} is no change", message.message_id));
                assert_eq!(message.body, serde_json::to_string(change).unwrap());
                assert_eq!(message.order_id, change.order_id);
                assert_eq!(message.attempts, 0);
                let (row, shown) = t.ops.forward_row(message.id).unwrap().unwrap();
                assert_eq!(row.message_id, message.message_id);
                assert_eq!(shown, serde_json::to_string_pretty(change).unwrap());
            }
            let results: Vec<_> = claimed.iter().map(|c| (c.id, SendOutcome::Sent)).collect();
            assert!(forward_results(&t, "relay-a", &results)
                .await
                .iter()
                .all(|owned| *owned));
            sent.extend(claimed.into_iter().map(|c| c.message_id));
        }
        sent.sort();
        let mut ids: Vec<String> = changes.iter().map(|c| c.id.clone()).collect();
        ids.sort();
        assert_eq!(sent, ids, "every change sent once");

        // Off: changes go on, none is queued; what was queued stays.
        assert!(t.ops.set_forwarding(false, t.now()).unwrap(), "turned off");
        assert!(
            !t.ops.set_forwarding(false, t.now()).unwrap(),
            "off already"
        );
        assert_eq!(
            t.record(paid("evt_4", "ord_late")).await,
            Outcome::Processed
        );
        t.ops
            .set_status_by_operator("ord_api", &by_operator(Refunded), t.now())
            .unwrap();
        assert_eq!(t.store.changes(None, ALL).await.unwrap().len(), 7);
        let after = forward_rows(&t);
        assert_eq!(after.len(), 4, "{after:?}");
        assert!(after.iter().all(|r| r.status == "sent"), "{after:?}");
        assert!(claim_changes(&t, "relay-a", 10).await.is_empty());

        // On again: the next change is queued.
        assert!(t.ops.set_forwarding(true, t.now()).unwrap());
        t.ops
            .set_status_by_operator("ord_late", &by_operator(Refunded), t.now())
            .unwrap();
        let last = t.store.changes(None, ALL).await.unwrap().pop().unwrap();
        let after = forward_rows(&t);
        assert_eq!(after.len(), 5, "{after:?}");
        assert_eq!(after[4].message_id, last.id);
        let claimed = claim_changes(&t, "relay-a", 10).await;
        assert_eq!(claimed.len(), 1);
        assert_eq!(claimed[0].body, serde_json::to_string(&last).unwrap());
    }

    /// A claim takes the oldest unfinished change of each order only: with two of one order's
    /// changes due, the second waits until the first is sent, even with room in the claim.
    pub async fn forwarded_changes_of_an_order_are_claimed_one_at_a_time_in_order(t: Ctx) {
        let [a1, a2, b1, a3] = changes_of_two_orders(&t).await;
        let claimed = claim_changes(&t, "relay-a", 10).await;
        assert_eq!(claimed_ids(&claimed), [a1, b1]);
        let sequences: Vec<(String, i64)> = claimed
            .iter()
            .map(|c| {
                let body: Value = serde_json::from_str(&c.body).unwrap();
                (
                    body["order_id"].as_str().unwrap().to_owned(),
                    body["sequence"].as_i64().unwrap(),
                )
            })
            .collect();
        assert_eq!(sequences, [("ord_a".into(), 1), ("ord_b".into(), 1)]);
        assert!(claim_changes(&t, "relay-b", 10).await.is_empty());

        assert_eq!(
            forward_results(&t, "relay-a", &[(a1, SendOutcome::Sent)]).await,
            [true]
        );
        assert_eq!(claimed_ids(&claim_changes(&t, "relay-b", 10).await), [a2]);
        assert_eq!(
            forward_results(&t, "relay-b", &[(a2, SendOutcome::Sent)]).await,
            [true]
        );
        assert_eq!(
            forward_results(&t, "relay-a", &[(b1, SendOutcome::Sent)]).await,
            [true]
        );
        let last = claim_changes(&t, "relay-a", 10).await;
        assert_eq!(claimed_ids(&last), [a3]);
        let body: Value = serde_json::from_str(&last[0].body).unwrap();
        assert_eq!(
            (&body["sequence"], &body["status"]),
            (&json!(3), &json!("refunded"))
        );
        assert_eq!(
            forward_results(&t, "relay-a", &[(a3, SendOutcome::Sent)]).await,
            [true]
        );
        assert!(claim_changes(&t, "relay-a", 10).await.is_empty());
        assert!(forward_rows(&t).iter().all(|r| r.status == "sent"));
    }

    /// A change whose send failed waits for its retry time, and its order's later changes wait
    /// behind it; other orders' changes do not.
    pub async fn a_forward_waiting_to_be_tried_again_holds_back_its_orders_later_changes(t: Ctx) {
        let [a1, a2, b1, _] = changes_of_two_orders(&t).await;
        assert_eq!(
            claimed_ids(&claim_changes(&t, "relay-a", 10).await),
            [a1, b1]
        );
        let first_try = t.now_ms();
        let retry_at = first_try + 60_000;
        assert_eq!(
            forward_results(
                &t,
                "relay-a",
                &[(a1, failed(Some(retry_at))), (b1, SendOutcome::Sent)]
            )
            .await,
            [true, true]
        );
        let row = forward_row(&t, a1);
        assert_eq!((row.status.as_str(), row.attempts), ("pending", 1));
        assert_eq!(row.next_attempt_at, Some(iso_millis(retry_at)));
        assert_eq!(row.first_tried_at, Some(iso_millis(first_try)));
        assert_eq!(row.last_error.as_deref(), Some("550 mailbox unavailable"));
        assert_eq!((row.lease_owner, row.lease_until), (None, None));

        assert!(claim_changes(&t, "relay-b", 10).await.is_empty());
        t.advance(59);
        assert!(claim_changes(&t, "relay-b", 10).await.is_empty());
        t.advance(1);
        let again = claim_changes(&t, "relay-b", 10).await;
        assert_eq!(
            claimed_ids(&again),
            [a1],
            "its turn, before the order's next"
        );
        assert_eq!(again[0].attempts, 1);
        assert!(again[0].message_id.starts_with("chg_"));
        assert_eq!(again[0].message_id, forward_row(&t, a1).message_id);
        assert_eq!(
            forward_results(&t, "relay-b", &[(a1, SendOutcome::Sent)]).await,
            [true]
        );
        assert_eq!(forward_row(&t, a1).attempts, 2);
        assert_eq!(claimed_ids(&claim_changes(&t, "relay-b", 10).await), [a2]);
    }

    /// A dead change (a failure with no retry) holds its order's later changes for good: an
    /// operator's retry makes it pending and due again, first in its order; a skip lets the
    /// later ones go. A pending change waiting for its retry may be skipped too.
    pub async fn a_dead_forward_holds_back_its_orders_later_changes_until_retried_or_skipped(
        t: Ctx,
    ) {
        let [a1, a2, b1, a3] = changes_of_two_orders(&t).await;
        claim_changes(&t, "relay-a", 10).await;
        assert_eq!(
            forward_results(
                &t,
                "relay-a",
                &[(a1, failed(None)), (b1, SendOutcome::Sent)]
            )
            .await,
            [true, true]
        );
        let dead = forward_row(&t, a1);
        assert_eq!((dead.status.as_str(), dead.attempts), ("dead", 1));
        assert_eq!(dead.next_attempt_at, None);
        t.advance(7 * 24 * 3600);
        assert!(claim_changes(&t, "relay-a", 10).await.is_empty());
        assert_eq!(forward_row(&t, a2).status, "pending");

        // Retried: a fresh start, and the first of its order again.
        assert_eq!(
            t.ops.retry_forward(a1, t.now_ms()).unwrap(),
            Retried::Revived
        );
        let revived = forward_row(&t, a1);
        assert_eq!((revived.status.as_str(), revived.attempts), ("pending", 0));
        assert_eq!(revived.first_tried_at, None);
        assert_eq!(revived.next_attempt_at, Some(iso_millis(t.now_ms())));
        let claimed = claim_changes(&t, "relay-a", 10).await;
        assert_eq!(claimed_ids(&claimed), [a1]);
        assert_eq!(claimed[0].attempts, 0);
        assert_eq!(
            forward_results(&t, "relay-a", &[(a1, failed(None))]).await,
            [true]
        );
        assert!(claim_changes(&t, "relay-a", 10).await.is_empty());

        // Skipped: never sent, and the order's next change goes.
        assert_eq!(
            t.ops.skip_forward(a1, t.now_ms()).unwrap(),
            Skipped::Skipped { was: "dead".into() }
        );
        let skipped = forward_row(&t, a1);
        assert_eq!(skipped.status, "skipped");
        assert_eq!((skipped.next_attempt_at, skipped.sent_at), (None, None));
        assert!(skipped.last_error.is_some());
        assert_eq!(claimed_ids(&claim_changes(&t, "relay-a", 10).await), [a2]);
        assert_eq!(
            t.ops.retry_forward(a1, t.now_ms()).unwrap(),
            Retried::Finished {
                status: "skipped".into()
            }
        );
        assert_eq!(
            t.ops.skip_forward(a1, t.now_ms()).unwrap(),
            Skipped::Finished {
                status: "skipped".into()
            }
        );

        // Pending, waiting an hour for its retry: skipped, the next one goes now.
        let retry_at = t.now_ms() + 3_600_000;
        assert_eq!(
            forward_results(&t, "relay-a", &[(a2, failed(Some(retry_at)))]).await,
            [true]
        );
        assert_eq!(
            t.ops.skip_forward(a2, t.now_ms()).unwrap(),
            Skipped::Skipped {
                was: "pending".into()
            }
        );
        assert_eq!(claimed_ids(&claim_changes(&t, "relay-a", 10).await), [a3]);
        assert_eq!(
            forward_results(&t, "relay-a", &[(a3, SendOutcome::Sent)]).await,
            [true]
        );
        t.advance(3600);
        assert!(
            claim_changes(&t, "relay-b", 10).await.is_empty(),
            "the skipped change is never sent"
        );
    }

    /// While a relay holds a change's lease no other relay gets it (nor the order's next
    /// change); once the lease runs out another relay does, with the same message, and the
    /// first relay's late result is refused and changes nothing.
    pub async fn a_leased_forward_goes_to_no_other_relay_until_its_lease_runs_out(t: Ctx) {
        let [a1, a2, b1, _] = changes_of_two_orders(&t).await;
        let first = claim_changes(&t, "relay-a", 1).await;
        assert_eq!(claimed_ids(&first), [a1]);
        let row = forward_row(&t, a1);
        assert_eq!(row.lease_owner.as_deref(), Some("relay-a"));
        assert_eq!(
            row.lease_until,
            Some(iso_millis(T0 * 1000 + LEASE_MS)),
            "leased until now + lease"
        );
        assert_eq!(claimed_ids(&claim_changes(&t, "relay-a", 10).await), [b1]);
        assert!(claim_changes(&t, "relay-b", 10).await.is_empty());
        t.advance((LEASE_MS / 1000 - 1) as u64);
        assert!(claim_changes(&t, "relay-b", 10).await.is_empty());
        t.advance(1);
        let taken = claim_changes(&t, "relay-b", 10).await;
        assert_eq!(claimed_ids(&taken), [a1, b1], "not a2: a1 is still unsent");
        assert_eq!(
            (&taken[0].message_id, &taken[0].body),
            (&first[0].message_id, &first[0].body),
            "the same message again"
        );
        assert_eq!(forward_row(&t, a1).lease_owner.as_deref(), Some("relay-b"));

        let before = forward_json(&t, a1);
        assert_eq!(
            forward_results(&t, "relay-a", &[(a1, SendOutcome::Sent)]).await,
            [false]
        );
        assert_eq!(
            forward_json(&t, a1),
            before,
            "the late result changed the row"
        );
        assert!(claim_changes(&t, "relay-c", 10).await.is_empty());
        assert_eq!(
            forward_results(&t, "relay-b", &[(a1, SendOutcome::Sent)]).await,
            [true]
        );
        let sent = forward_row(&t, a1);
        assert_eq!((sent.status.as_str(), sent.attempts), ("sent", 1));
        assert_eq!(sent.sent_at, Some(iso_millis(t.now_ms())));
        assert_eq!((sent.lease_owner, sent.lease_until), (None, None));
        assert_eq!(claimed_ids(&claim_changes(&t, "relay-c", 10).await), [a2]);
    }

    /// The endpoint unreachable: the change is due again when told, with no attempt counted
    /// and no first try, its reason kept; a counted failure after that counts one.
    pub async fn a_forward_the_endpoint_never_received_counts_no_attempt(t: Ctx) {
        assert!(t.ops.set_forwarding(true, t.now()).unwrap());
        assert_eq!(t.record(paid("evt_1", "ord_1")).await, Outcome::Processed);
        let claimed = claim_changes(&t, "relay-a", 10).await;
        assert_eq!(claimed.len(), 1);
        let id = claimed[0].id;
        assert_eq!(
            forward_results(&t, "relay-a", &[(id, untried(Some(t.now_ms())))]).await,
            [true]
        );
        let row = forward_row(&t, id);
        assert_eq!((row.status.as_str(), row.attempts), ("pending", 0));
        assert_eq!(row.first_tried_at, None);
        assert_eq!(row.last_error.as_deref(), Some("transport unavailable"));
        let listed = t.ops.forwards(&OutboxQuery::newest(ALL)).unwrap();
        assert_eq!(listed[0].attempts, 0);

        let again = claim_changes(&t, "relay-a", 10).await;
        assert_eq!(claimed_ids(&again), [id]);
        assert_eq!(again[0].attempts, 0);
        assert_eq!(
            forward_results(&t, "relay-a", &[(id, failed(Some(t.now_ms())))]).await,
            [true]
        );
        let row = forward_row(&t, id);
        assert_eq!(row.attempts, 1);
        assert_eq!(row.first_tried_at, Some(iso_millis(t.now_ms())));
        t.advance(1);
        let again = claim_changes(&t, "relay-a", 10).await;
        assert_eq!(again[0].attempts, 1);
        assert_eq!(
            forward_results(&t, "relay-a", &[(id, untried(Some(t.now_ms())))]).await,
            [true]
        );
        assert_eq!(forward_row(&t, id).attempts, 1);
    }

    /// An operator's skip or retry leaves a change a relay is sending alone (its relay still
    /// records its result), and a sent one, saying why; a missing id is missing. Once the
    /// relay's lease ran out (it died), the change may be skipped, and that relay's result is
    /// then refused.
    pub async fn skip_and_retry_leave_a_forward_being_sent_or_finished_alone(t: Ctx) {
        assert!(t.ops.set_forwarding(true, t.now()).unwrap());
        t.record(paid("evt_1", "ord_1")).await;
        t.record(paid("evt_2", "ord_2")).await;
        let [x, y] = [forward_rows(&t)[0].id, forward_rows(&t)[1].id];
        assert_eq!(claimed_ids(&claim_changes(&t, "relay-a", 1).await), [x]);
        t.advance(10);
        let leased = forward_json(&t, x);
        let until = iso_millis(T0 * 1000 + LEASE_MS);
        assert_eq!(
            t.ops.skip_forward(x, t.now_ms()).unwrap(),
            Skipped::Leased {
                owner: "relay-a".into(),
                until: until.clone()
            }
        );
        assert_eq!(
            t.ops.retry_forward(x, t.now_ms()).unwrap(),
            Retried::Leased {
                owner: "relay-a".into(),
                until
            }
        );
        assert_eq!(forward_json(&t, x), leased, "a leased change is left alone");
        assert_eq!(
            forward_results(&t, "relay-a", &[(x, SendOutcome::Sent)]).await,
            [true]
        );
        for _ in 0..2 {
            assert_eq!(
                t.ops.skip_forward(x, t.now_ms()).unwrap(),
                Skipped::Finished {
                    status: "sent".into()
                }
            );
        }
        assert_eq!(
            t.ops.retry_forward(x, t.now_ms()).unwrap(),
            Retried::Finished {
                status: "sent".into()
            }
        );
        assert_eq!(forward_row(&t, x).status, "sent");
        assert_eq!(
            t.ops.skip_forward(999_999, t.now_ms()).unwrap(),
            Skipped::Missing
        );
        assert_eq!(
            t.ops.retry_forward(999_999, t.now_ms()).unwrap(),
            Retried::Missing
        );

        // Pending and due since it was queued: retry keeps it so.
        assert_eq!(
            t.ops.retry_forward(y, t.now_ms()).unwrap(),
            Retried::DueNow {
                was: iso_millis(T0 * 1000),
                attempts: 0
            }
        );
        assert_eq!(claimed_ids(&claim_changes(&t, "relay-b", 10).await), [y]);
        t.advance(LEASE_MS as u64 / 1000);
        assert_eq!(
            t.ops.skip_forward(y, t.now_ms()).unwrap(),
            Skipped::Skipped {
                was: "pending".into()
            }
        );
        assert_eq!(
            forward_results(&t, "relay-b", &[(y, SendOutcome::Sent)]).await,
            [false]
        );
        let skipped = forward_row(&t, y);
        assert_eq!(
            (
                skipped.status.as_str(),
                skipped.lease_owner,
                skipped.sent_at
            ),
            ("skipped", None, None)
        );
        assert!(claim_changes(&t, "relay-b", 10).await.is_empty());
    }

    /// `sekali forward list`: newest first, filtered by status, order and time together, up to
    /// the limit; `show` is the listed row and its message, the change as pretty JSON.
    pub async fn forwards_are_listed_newest_first_and_filtered_by_status_order_and_time(t: Ctx) {
        assert!(t.ops.set_forwarding(true, t.now()).unwrap());
        t.record(paid("evt_1", "ord_1")).await;
        t.advance(100);
        t.record(paid("evt_2", "ord_2")).await;
        t.ops
            .set_status_by_operator("ord_1", &by_operator(Refunded), t.now())
            .unwrap();
        t.advance(100);
        t.record(paid("evt_3", "ord_3")).await;

        let all = t.ops.forwards(&OutboxQuery::newest(ALL)).unwrap();
        let listed: Vec<(&str, &str, String)> = all
            .iter()
            .map(|r| (r.order_id.as_str(), r.kind.as_str(), r.created_at.clone()))
            .collect();
        assert_eq!(
            listed,
            [
                ("ord_3", "order.paid", iso_seconds(T0 + 200)),
                ("ord_1", "order.refunded", iso_seconds(T0 + 100)),
                ("ord_2", "order.paid", iso_seconds(T0 + 100)),
                ("ord_1", "order.paid", iso_seconds(T0)),
            ]
        );
        assert!(all.windows(2).all(|w| w[0].id > w[1].id), "newest first");
        let (r4, r3, r2, r1) = (all[0].id, all[1].id, all[2].id, all[3].id);
        assert_eq!(
            claimed_ids(&claim_changes(&t, "relay-a", 10).await),
            [r1, r2, r4]
        );
        assert_eq!(
            forward_results(
                &t,
                "relay-a",
                &[(r1, SendOutcome::Sent), (r2, failed(None))]
            )
            .await,
            [true, true]
        );

        let query = |status: Option<&str>, order_id: Option<&str>, since: Option<i64>, limit| {
            t.ops
                .forwards(&OutboxQuery {
                    status: status.map(Into::into),
                    order_id: order_id.map(Into::into),
                    since_unix: since,
                    limit,
                })
                .unwrap()
                .iter()
                .map(|r| r.id)
                .collect::<Vec<i64>>()
        };
        assert_eq!(query(Some("sent"), None, None, ALL), [r1]);
        assert_eq!(query(Some("dead"), None, None, ALL), [r2]);
        assert_eq!(query(Some("pending"), None, None, ALL), [r4, r3]);
        assert!(query(Some("skipped"), None, None, ALL).is_empty());
        assert_eq!(query(None, Some("ord_1"), None, ALL), [r3, r1]);
        assert!(query(None, Some("ord_missing"), None, ALL).is_empty());
        assert_eq!(query(None, None, Some(T0 + 100), ALL), [r4, r3, r2]);
        assert_eq!(query(None, None, Some(T0 + 101), ALL), [r4]);
        assert_eq!(query(None, Some("ord_1"), Some(T0 + 100), ALL), [r3]);
        assert_eq!(query(Some("pending"), Some("ord_1"), None, ALL), [r3]);
        assert!(query(Some("sent"), None, Some(T0 + 100), ALL).is_empty());
        assert_eq!(query(None, None, None, 2), [r4, r3]);
        assert_eq!(query(Some("pending"), None, None, 1), [r4]);

        let feed = t.store.changes(None, ALL).await.unwrap();
        for row in t.ops.forwards(&OutboxQuery::newest(ALL)).unwrap() {
            let (shown, body) = t.ops.forward_row(row.id).unwrap().unwrap();
            assert_eq!(
                serde_json::to_value(&shown).unwrap(),
                serde_json::to_value(&row).unwrap()
            );
            let change = feed.iter().find(|c| c.id == row.message_id).unwrap();
            assert_eq!(body, serde_json::to_string_pretty(change).unwrap());
        }
        assert!(t.ops.forward_row(999_999).unwrap().is_none());
    }

    /// Relays claiming at the same moment never take the same change, nor two changes of one
    /// order: drained round by round, every change is claimed once, each order's in its order.
    pub async fn concurrent_forward_claims_take_each_change_once_and_each_orders_in_order(t: Ctx) {
        assert!(t.ops.set_forwarding(true, t.now()).unwrap());
        const ORDERS: usize = 12;
        for i in 0..ORDERS {
            t.create_api_order(new_order(&format!("ord_{i}"))).await;
        }
        for i in 0..ORDERS {
            t.record(paid(&format!("evt_{i}"), &format!("ord_{i}")))
                .await;
        }
        for i in 0..ORDERS {
            t.ops
                .set_status_by_operator(&format!("ord_{i}"), &by_operator(Refunded), t.now())
                .unwrap();
        }
        assert_eq!(forward_rows(&t).len(), ORDERS * 3);

        let owners = ["relay-a", "relay-b", "relay-c", "relay-d"];
        let t = &t;
        let mut seen: std::collections::HashMap<String, Vec<i64>> = Default::default();
        let mut claimed_total = 0;
        for _round in 0..10 {
            let claims = join_all(owners.iter().map(|owner| claim_changes(t, owner, 5))).await;
            let round: Vec<(&str, &ClaimedForward)> = owners
                .iter()
                .zip(&claims)
                .flat_map(|(owner, claimed)| claimed.iter().map(move |c| (*owner, c)))
                .collect();
            if round.is_empty() {
                break;
            }
            let orders: std::collections::HashSet<&str> =
                round.iter().map(|(_, c)| c.order_id.as_str()).collect();
            assert_eq!(
                orders.len(),
                round.len(),
                "two claims took one change, or two changes of one order"
            );
            for (_, c) in &round {
                let body: Value = serde_json::from_str(&c.body).unwrap();
                seen.entry(c.order_id.clone())
                    .or_default()
                    .push(body["sequence"].as_i64().unwrap());
            }
            claimed_total += round.len();
            let recorded = join_all(owners.iter().zip(&claims).map(|(owner, claimed)| {
                let results: Vec<_> = claimed.iter().map(|c| (c.id, SendOutcome::Sent)).collect();
                async move { forward_results(t, owner, &results).await }
            }))
            .await;
            assert!(
                recorded.iter().flatten().all(|owned| *owned),
                "{recorded:?}"
            );
        }
        assert_eq!(claimed_total, ORDERS * 3, "each change claimed once");
        assert_eq!(seen.len(), ORDERS);
        for (order_id, sequences) in &seen {
            assert_eq!(sequences, &[1, 2, 3], "{order_id}");
        }
        assert!(forward_rows(t).iter().all(|r| r.status == "sent"));
    }

    // --- backup --------------------------------------------------------------------------------

    /// A backup is a copy as of the moment it was taken: its report counts what it holds, and
    /// the copy reads the same orders and events (what is written afterwards is not in it).
    pub async fn a_backup_holds_the_orders_and_events_as_they_were(t: Ctx) {
        t.record(paid("evt_1", "ord_1")).await;
        t.record(ev("evt_2").order("ord_2").to(Pending)).await;
        t.record(ev("evt_3").kind("customer.created")).await;
        t.create_api_order(new_order("ord_3")).await;
        let out = t.engine.backup_path();
        let report = t.ops.backup(&out).unwrap();
        assert_eq!((report.orders, report.processed_events), (3, 3));
        assert!(report.pages > 0);
        t.advance(1);
        t.record(paid("evt_4", "ord_4")).await;

        let Some(copy) = t.engine.open_backup(&out) else {
            eprintln!("this engine's backups cannot be opened here: the report alone was checked");
            return;
        };
        for order_id in ["ord_1", "ord_2", "ord_3"] {
            let original = t.ops.order(order_id).unwrap();
            assert!(original.is_some());
            assert_eq!(copy.order(order_id).unwrap(), original);
        }
        assert_eq!(copy.order("ord_4").unwrap(), None);
        let events =
            |m: &dyn Maintenance| serde_json::to_value(m.events(&EventQuery::newest(ALL)).unwrap());
        let mut now = events(&*t.ops).unwrap();
        now.as_array_mut().unwrap().remove(0); // evt_4, after the backup
        assert_eq!(events(&*copy).unwrap(), now);
        assert_eq!(
            serde_json::to_value(copy.outbox(&OutboxQuery::newest(ALL)).unwrap()).unwrap(),
            serde_json::to_value(t.ops.outbox(&OutboxQuery::newest(ALL)).unwrap()[1..].to_vec())
                .unwrap()
        );
    }

    /// A backup holds the forwarding rows as they were, each with its message.
    pub async fn a_backup_holds_the_forwarded_changes_as_they_were(t: Ctx) {
        assert!(t.ops.set_forwarding(true, t.now()).unwrap());
        t.record(paid("evt_1", "ord_1")).await;
        t.create_api_order(new_order("ord_2")).await;
        let claimed = claim_changes(&t, "relay-a", 1).await;
        assert_eq!(
            forward_results(&t, "relay-a", &[(claimed[0].id, SendOutcome::Sent)]).await,
            [true]
        );
        let rows = serde_json::to_value(t.ops.forwards(&OutboxQuery::newest(ALL)).unwrap());
        let out = t.engine.backup_path();
        t.ops.backup(&out).unwrap();
        t.advance(1);
        t.record(paid("evt_3", "ord_3")).await;

        let Some(copy) = t.engine.open_backup(&out) else {
            eprintln!("this engine's backups cannot be opened here");
            return;
        };
        let copied = copy.forwards(&OutboxQuery::newest(ALL)).unwrap();
        assert_eq!(serde_json::to_value(&copied).unwrap(), rows.unwrap());
        assert_eq!(copied.len(), 2);
        for row in &copied {
            assert_eq!(
                copy.forward_row(row.id).unwrap().map(|(_, body)| body),
                t.ops.forward_row(row.id).unwrap().map(|(_, body)| body)
            );
        }
    }

    pub async fn a_backup_never_overwrites_an_existing_file(t: Ctx) {
        t.record(paid("evt_1", "ord_1")).await;
        let out = t.engine.backup_path();
        std::fs::write(&out, "keep me").unwrap();
        let refused = t.ops.backup(&out);
        assert!(
            matches!(&refused, Err(StoreError::Exists(_))),
            "{refused:?}"
        );
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep me");
    }
}

// ==========================================================================================
// The SQLite engine: the one place this suite names an engine. A second engine adds its own
// `Engine` impl here and one `conformance_suite!` line.
// ==========================================================================================

mod sqlite_engine {
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    use sekali::clock::SharedClock;
    use sekali::store::sqlite::{
        SqliteMaintenance, SqliteStore, WriterConfig, DEFAULT_BUSY_TIMEOUT,
    };
    use sekali::store::{CommitFaults, Maintenance, Store};

    use super::Engine;

    /// A database file in a temporary directory of its own, removed with it.
    pub struct SqliteEngine {
        dir: tempfile::TempDir,
    }

    impl Engine for SqliteEngine {
        fn new() -> Option<Self> {
            Some(SqliteEngine {
                dir: tempfile::tempdir().expect("a temporary directory"),
            })
        }

        fn open(
            &self,
            clock: SharedClock,
            commit_faults: CommitFaults,
        ) -> (Arc<dyn Store>, Box<dyn Maintenance>) {
            let db_path = self.dir.path().join("sekali.db");
            let store = SqliteStore::open(
                WriterConfig {
                    db_path: db_path.clone(),
                    batch_max: 64,
                    queue_capacity: 256,
                    busy_timeout: DEFAULT_BUSY_TIMEOUT,
                    max_page_count: None,
                    reread: None,
                    commit_faults,
                },
                clock,
            )
            .expect("the store opens");
            let maintenance = SqliteMaintenance::open(&db_path, true).expect("the database opens");
            (Arc::new(store), Box::new(maintenance))
        }

        fn backup_path(&self) -> PathBuf {
            self.dir.path().join("backup.db")
        }

        fn open_backup(&self, path: &Path) -> Option<Box<dyn Maintenance>> {
            Some(Box::new(
                SqliteMaintenance::open(path, false).expect("the copy opens"),
            ))
        }
    }
}

use sqlite_engine::SqliteEngine;

conformance_suite!(sqlite, SqliteEngine);

// ==========================================================================================
// The PostgreSQL engine, on a private server this test binary starts (tests/support).
// ==========================================================================================

#[path = "support/postgres.rs"]
mod pg_cluster;

mod postgres_engine {
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    use sekali::clock::SharedClock;
    use sekali::store::postgres::{PgMaintenance, PgStore, Target, WriterConfig};
    use sekali::store::sqlite::SqliteMaintenance;
    use sekali::store::{CommitFaults, Maintenance, Store};

    use super::pg_cluster;
    use super::Engine;

    /// A database of its own on the shared private server.
    pub struct PgEngine {
        target: Target,
        dir: tempfile::TempDir,
    }

    impl Engine for PgEngine {
        fn new() -> Option<Self> {
            let cluster = pg_cluster::shared()?;
            let database = cluster.fresh_database();
            Some(PgEngine {
                target: Target::parse(&cluster.url(&database)).expect("the test URL"),
                dir: tempfile::tempdir().expect("a temporary directory"),
            })
        }

        fn skipped() -> &'static str {
            pg_cluster::skip_note()
        }

        fn open(
            &self,
            clock: SharedClock,
            commit_faults: CommitFaults,
        ) -> (Arc<dyn Store>, Box<dyn Maintenance>) {
            let store = PgStore::open(
                WriterConfig {
                    target: self.target.clone(),
                    writers: 2,
                    batch_max: 64,
                    queue_capacity: 256,
                    commit_faults,
                },
                clock,
            )
            .expect("the store opens");
            let maintenance = PgMaintenance::open(&self.target, true).expect("the database opens");
            (Arc::new(store), Box::new(maintenance))
        }

        fn backup_path(&self) -> PathBuf {
            self.dir.path().join("backup.db")
        }

        /// A PostgreSQL database's backup is a SQLite file (`sekali backup`).
        fn open_backup(&self, path: &Path) -> Option<Box<dyn Maintenance>> {
            Some(Box::new(
                SqliteMaintenance::open(path, false).expect("the copy opens"),
            ))
        }
    }
}

use postgres_engine::PgEngine;

conformance_suite!(postgres, PgEngine);
