//! What an event does to its order: a pure function of the order as it stands, its payments
//! before the event's facts were merged and after, and the event.
//!
//! The store merges the event's facts into its payment (`ledger::PaymentFacts::merge`), reads
//! the order and its payments, asks [`decide`], and writes what it says; it decides nothing
//! itself. The order's status comes from the ledger ([`ledger::compute`]); this adds what a
//! change of it calls for: the order's row, whether the audit trail records it, the emails, and
//! the delivery's outcome.

use super::ledger::{self, Computed, OperatorDecision, OrderPayment, ReviewKind, Terms};
use super::money::iso_exponent;
use super::notice::{self, QueuedNotice};
use super::{NormalizedEvent, OrderStatus, ProviderName};

/// What happened to a delivery. All but `Duplicate` are stored in `processed_events.outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Its facts changed what the ledger knew, or said exactly what it knew (another event of
    /// the same change: a Checkout Session beside its PaymentIntent, Xendit's `SETTLED` after
    /// `PAID`), or the order was created or changed status.
    Processed,
    /// Its facts said less than the ledger knew (a `pending` after the payment, a partial refund
    /// after a larger one), and the order's status did not change.
    Stale,
    /// Nothing sekali acts on: a type it does not read, or no payment named.
    Ignored,
    /// Its facts are about a payment no order is linked to yet: they wait on the payment, and
    /// count once an event names the payment and its order.
    Parked,
    /// A payment that does not match what its order asked for (amount, currency, provider): the
    /// order went to `needs_review`.
    AmountMismatch,
    /// The provider took back a payment it had settled: the order went to `needs_review`.
    Reversed,
    /// Its facts put the order in `needs_review` for another reason (two payments took money,
    /// money taken after a cancel, more given back than taken, a refund the customer was told of
    /// failed).
    NeedsReview,
    /// The event id was already claimed: nothing changed.
    Duplicate,
}

impl Outcome {
    /// Every outcome a stored event can have (not `duplicate`, which is never stored).
    pub const STORED: [Outcome; 7] = [
        Outcome::Processed,
        Outcome::Stale,
        Outcome::Ignored,
        Outcome::Parked,
        Outcome::AmountMismatch,
        Outcome::Reversed,
        Outcome::NeedsReview,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Processed => "processed",
            Outcome::Stale => "stale",
            Outcome::Ignored => "ignored",
            Outcome::Parked => "parked",
            Outcome::AmountMismatch => "amount_mismatch",
            Outcome::Reversed => "reversed",
            Outcome::NeedsReview => "needs_review",
            Outcome::Duplicate => "duplicate",
        }
    }

    /// The outcome named `text`, among those stored.
    pub fn parse(text: &str) -> Option<Outcome> {
        Outcome::STORED.into_iter().find(|o| o.as_str() == text)
    }
}

/// An order as the decisions see it (`orders`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderState {
    /// Whose payments it expects (`orders.provider`); its amounts are in that provider's minor
    /// units.
    pub provider: ProviderName,
    /// Decimals of its amounts (`orders.amount_exponent`); `None` for orders written before
    /// sekali kept it (ISO 4217's then).
    pub exponent: Option<u32>,
    pub status: OrderStatus,
    /// Created through the API (its amount, currency and provider are the shop's own).
    pub from_api: bool,
    pub amount: Option<i64>,
    /// Money given back to the customer, in the order's units.
    pub refunded_amount: i64,
    pub currency: Option<String>,
    /// Where the customer's emails go: the shop's own address for an API order created with
    /// one, which no webhook overwrites; else the payer's, the newest reported.
    pub customer_email: Option<String>,
    /// The payer's address as the provider last reported it (`orders.payer_email`).
    pub payer_email: Option<String>,
    /// The payment that took its money, else the first one linked to it.
    pub payment_ref: Option<String>,
    /// The money its payments took, in the order's units, and their currency.
    pub paid_amount: Option<i64>,
    pub paid_currency: Option<String>,
    /// Why it needs a look (`orders.review_reason`), while it does.
    pub review: Option<String>,
    /// An operator's decision that stands until money moves.
    pub operator: Option<OperatorDecision>,
    /// Review reasons an operator has seen and decided on: they no longer count.
    pub acknowledged: Vec<String>,
    /// Money returned that the customer was told of (ISO 4217 minor units): a refund notice
    /// went out for it.
    pub announced: i64,
}

impl OrderState {
    /// The shop's terms for the order's payments.
    pub fn terms(&self) -> Terms {
        Terms {
            from_api: self.from_api,
            provider: self.provider.to_string(),
            amount: self.amount,
            exponent: self.exponent,
            currency: self.currency.clone(),
        }
    }
}

/// What to write for an event's facts, given the order as it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub outcome: Outcome,
    /// The order to write: inserted when `from` is `None` and `created`, else updated.
    pub next: OrderState,
    /// True when the event created the order.
    pub created: bool,
    /// The status before, when the audit trail records this change (a new status, or more or
    /// less money given back); `None` with `record` for the change that created the order.
    pub from: Option<OrderStatus>,
    /// True when the change goes in the audit trail.
    pub record: bool,
    /// The emails the change calls for.
    pub notices: Vec<QueuedNotice>,
}

/// What an event's facts were to its payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum News {
    /// They changed what the payment says.
    New,
    /// They say exactly what the payment says (another event of the same change: Stripe's
    /// `checkout.session.completed` beside `payment_intent.succeeded`, Xendit's `SETTLED` after
    /// `PAID`).
    Same,
    /// They say less than the payment says: an earlier state (a `pending` after the payment, a
    /// partial refund after a larger one).
    Older,
}

/// Decides what `event` does to the order `order_id`: `current` as it stands (`None`: not seen
/// yet), its payments `before` the event's facts were merged and `after`, and what the facts
/// were to their payment (`news`).
pub fn decide(
    order_id: &str,
    current: Option<&OrderState>,
    event: &NormalizedEvent,
    before: &[OrderPayment<'_>],
    after: &[OrderPayment<'_>],
    news: News,
) -> Decision {
    let email = event.payer_email.as_ref().map(|e| e.to_string());
    let created = current.is_none();
    let current = current.cloned().unwrap_or_else(|| new_order(event, after));
    let terms = current.terms();
    let computed_before = ledger::compute(
        &terms,
        before,
        current.operator.as_ref(),
        &current.acknowledged,
        current.announced,
    );
    let after_state = ledger::compute(
        &terms,
        after,
        current.operator.as_ref(),
        &current.acknowledged,
        current.announced,
    );

    let mut next = fill_in_details(&current, event, after, email);
    apply_money(&mut next, &after_state, after);
    // An operator's decision stands until money moves.
    if next
        .operator
        .as_ref()
        .is_some_and(|decision| decision.money != after_state.money)
    {
        next.operator = None;
    }

    let mut notices = Vec::new();
    let provider = event.provider.as_str();
    if computed_before.money.captured == 0 && after_state.money.captured > 0 {
        notices.extend(notice::receipt(
            order_id,
            after_state.money.captured,
            after_state.currency.as_deref(),
            provider,
            &event.event_id,
        ));
    }
    if after_state.money.returned > current.announced {
        notices.extend(notice::refund(
            order_id,
            &next,
            after_state.money.returned - current.announced,
            after_state.money.returned,
            after_state.currency.as_deref(),
            provider,
            &event.event_id,
        ));
        next.announced = after_state.money.returned;
    }
    if next.status == OrderStatus::Failed && (created || current.status != OrderStatus::Failed) {
        notices.extend(notice::for_status(
            order_id,
            &next,
            provider,
            &event.event_id,
        ));
    }

    let record =
        created || next.status != current.status || next.refunded_amount != current.refunded_amount;
    let newly_in_review = after_state
        .review
        .as_ref()
        .filter(|review| Some(&review.reason) != computed_before.review.as_ref().map(|r| &r.reason))
        .map(|review| review.kind);
    let outcome = match newly_in_review {
        Some(ReviewKind::AmountMismatch) => Outcome::AmountMismatch,
        Some(ReviewKind::Reversed) => Outcome::Reversed,
        Some(_) => Outcome::NeedsReview,
        // Details filled in (an address, a currency) are not news: an event that brings only
        // them, and says less than is known, is stale.
        None if created || news != News::Older || next.status != current.status => {
            Outcome::Processed
        }
        None => Outcome::Stale,
    };
    Decision {
        outcome,
        from: (!created).then_some(current.status),
        created,
        record,
        next,
        notices,
    }
}

/// An order first seen through `event`: its provider's, in ISO 4217 units, for what its
/// payment asked for.
fn new_order(event: &NormalizedEvent, after: &[OrderPayment<'_>]) -> OrderState {
    let facts = event.payment.as_ref().map(|p| &p.facts);
    let currency = facts
        .and_then(|f| f.currency.clone())
        .or_else(|| after.iter().find_map(|p| p.facts.currency.clone()));
    OrderState {
        provider: event.provider.clone(),
        exponent: currency.as_deref().map(iso_exponent),
        status: OrderStatus::Pending,
        from_api: false,
        amount: facts.and_then(|f| f.requested.or(f.captured)),
        refunded_amount: 0,
        currency,
        customer_email: None,
        payer_email: None,
        payment_ref: event.payment_ref().map(str::to_owned),
        paid_amount: None,
        paid_currency: None,
        review: None,
        operator: None,
        acknowledged: Vec::new(),
        announced: 0,
    }
}

/// `current` with the details it lacks (an amount, a currency, an address, a payment) filled
/// in from the event; they are not effects, and even an event that changes nothing fills them.
fn fill_in_details(
    current: &OrderState,
    event: &NormalizedEvent,
    after: &[OrderPayment<'_>],
    email: Option<String>,
) -> OrderState {
    let mut next = current.clone();
    let facts = event.payment.as_ref().map(|p| &p.facts);
    if next.currency.is_none() {
        next.currency = facts
            .and_then(|f| f.currency.clone())
            .or_else(|| after.iter().find_map(|p| p.facts.currency.clone()));
        next.exponent = next.exponent.or(next.currency.as_deref().map(iso_exponent));
    }
    if next.amount.is_none() && next.exponent == next.currency.as_deref().map(iso_exponent) {
        next.amount = facts.and_then(|f| f.requested.or(f.captured));
    }
    if next.payment_ref.is_none() {
        next.payment_ref = event.payment_ref().map(str::to_owned);
    }
    // The newest address wins, but for the shop's own: an API order created with an address
    // keeps it (the payer's stays in `payer_email`).
    if email.is_some() {
        let shops_own = current.from_api && current.customer_email.is_some();
        if !shops_own {
            next.customer_email.clone_from(&email);
        }
        next.payer_email = email;
    }
    next
}

/// Writes what the ledger says onto the order: its status and review, the money given back and
/// taken in the order's units, and the payment that took the money.
fn apply_money(next: &mut OrderState, computed: &Computed, after: &[OrderPayment<'_>]) {
    next.status = computed.status;
    next.review = computed.review.as_ref().map(|r| r.reason.clone());
    let iso = computed.currency.as_deref().map_or(2, iso_exponent);
    let own = next.exponent.unwrap_or(iso);
    next.refunded_amount = rescale(computed.money.returned, iso, own);
    if computed.money.captured > 0 {
        next.paid_amount = Some(rescale(computed.money.captured, iso, own));
        next.paid_currency.clone_from(&computed.currency);
        if let Some(paying) = after.iter().find(|p| p.facts.captured() > 0) {
            next.payment_ref = Some(paying.reference.to_owned());
        }
    }
}

/// `amount` with `from` decimals, as an amount with `to` decimals: exact when `to` has more
/// (ISK 500 is Stripe's 50000), rounded toward zero when it has fewer, which no real amount needs
/// (a currency's payments are whole units of the coarser scale).
pub fn rescale(amount: i64, from: u32, to: u32) -> i64 {
    if to >= from {
        amount.saturating_mul(10i64.saturating_pow(to - from))
    } else {
        amount / 10i64.saturating_pow(from - to)
    }
}
