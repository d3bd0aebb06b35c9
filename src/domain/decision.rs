//! What an event does to its order: a pure function of the order as it stands and the event.
//!
//! The store reads the order, asks [`decide`], and writes what it says; it decides nothing
//! itself. So every arrow of the state machine, every refund rule and every notice is here, and
//! tested without a database.

use super::{EmailAddress, NormalizedEvent, OrderStatus, ProviderName, StatusChange};

/// What happened to a delivery. The first six are stored in `processed_events.outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Processed,
    Stale,
    Ignored,
    Parked,
    /// A payment for an API order did not match its amount or currency: the order went to
    /// `needs_review` instead of `paid`.
    AmountMismatch,
    /// The provider reversed the payment that paid the order (Midtrans `deny` or `cancel` of
    /// the transaction that settled): the order went from `paid` to `needs_review`, and no
    /// customer email was queued.
    Reversed,
    /// The event id was already claimed: nothing changed.
    Duplicate,
}

impl Outcome {
    /// The outcomes an event can be stored with: every one but [`Outcome::Duplicate`], which
    /// stores nothing.
    pub const STORED: [Outcome; 6] = [
        Outcome::Processed,
        Outcome::Stale,
        Outcome::Ignored,
        Outcome::Parked,
        Outcome::AmountMismatch,
        Outcome::Reversed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Processed => "processed",
            Outcome::Stale => "stale",
            Outcome::Ignored => "ignored",
            Outcome::Parked => "parked",
            Outcome::AmountMismatch => "amount_mismatch",
            Outcome::Reversed => "reversed",
            Outcome::Duplicate => "duplicate",
        }
    }
}

/// An order as the decisions see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderState {
    /// Whose payments move it (`orders.provider`); its amounts are in that provider's minor
    /// units.
    pub provider: ProviderName,
    /// Decimals of its amounts (`orders.amount_exponent`), as its provider counts them; `None`
    /// for orders written before sekali kept it.
    pub exponent: Option<u32>,
    pub status: OrderStatus,
    /// Created through the API (its amount and currency are the shop's own).
    pub from_api: bool,
    pub amount: Option<i64>,
    pub refunded_amount: i64,
    pub currency: Option<String>,
    /// Where the customer's emails go: the shop's own address for an API order created with
    /// one, which no webhook overwrites; else the payer's, the newest reported.
    pub customer_email: Option<String>,
    /// The payer's address as the provider last reported it (`orders.payer_email`).
    pub payer_email: Option<String>,
    /// The payment that paid it, else the first one linked to it (`orders.payment_intent_id`):
    /// a Stripe PaymentIntent or Charges API charge, a Midtrans `transaction_id`. A reversal
    /// must name it.
    pub payment_ref: Option<String>,
    /// What the payment that moved it to `paid` (or to `needs_review` for a mismatch) said was
    /// paid, and in which currency: what the receipt shows.
    pub paid_amount: Option<i64>,
    pub paid_currency: Option<String>,
}

/// What to write for an event with a status change, given the order's current state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The order does not exist yet: create it in `state` (a status change from nothing).
    Create { state: OrderState },
    /// A status change (or a further refund): write `next`, record the transition from `from`,
    /// and queue the notice `next.status` carries.
    Move {
        from: OrderStatus,
        next: OrderState,
        outcome: Outcome,
    },
    /// No status change. `next` differs from the current state only in details the order lacked
    /// (first amount, currency, address, payment): those are filled in, which are not effects.
    Keep { next: OrderState, outcome: Outcome },
}

impl Decision {
    pub fn outcome(&self) -> Outcome {
        match self {
            Decision::Create { .. } => Outcome::Processed,
            Decision::Move { outcome, .. } | Decision::Keep { outcome, .. } => *outcome,
        }
    }
}

/// Decides what `event`'s `change` does to the order `current` (`None`: not seen yet).
pub fn decide(
    current: Option<&OrderState>,
    event: &NormalizedEvent,
    change: &StatusChange,
) -> Decision {
    let target = change.target;
    let email = change.customer_email.as_ref().map(EmailAddress::to_string);
    let Some(current) = current else {
        // First seen through this event: created in the state the event reports.
        let paid = target == OrderStatus::Paid;
        return Decision::Create {
            state: OrderState {
                provider: event.provider.clone(),
                exponent: change.exponent,
                status: target,
                from_api: false,
                amount: change.amount,
                refunded_amount: if target.is_refund() {
                    change.refunded_amount.unwrap_or(0)
                } else {
                    0
                },
                currency: change.currency.clone(),
                customer_email: email.clone(),
                payer_email: email,
                payment_ref: event.payment_ref.clone(),
                paid_amount: if paid { change.paid_amount } else { None },
                paid_currency: if paid { change.currency.clone() } else { None },
            },
        };
    };

    let refunded = change.refunded_amount.unwrap_or(0);
    let further_refund =
        target == current.status && target.is_refund() && refunded > current.refunded_amount;
    let reversal = change.reverses_payment
        && current.status == OrderStatus::Paid
        && reverses_the_paying_transaction(current, event);
    let forward = (current.status.can_move_forward_to(target) || reversal)
        // A forward move that reports less refunded money than already recorded comes from an
        // older refund event than one already applied: money is never un-refunded.
        && !(target.is_refund() && refunded < current.refunded_amount);

    // Details the order lacks (first payment, amount, currency, email) are filled in from any
    // event, even one that does not move the status; they are not effects. The payer's address
    // is the newest reported.
    let mut next = OrderState {
        amount: current.amount.or(change.amount),
        exponent: current.exponent.or(change.exponent),
        currency: current.currency.clone().or_else(|| change.currency.clone()),
        customer_email: current.customer_email.clone().or_else(|| email.clone()),
        payer_email: email.clone().or_else(|| current.payer_email.clone()),
        payment_ref: current
            .payment_ref
            .clone()
            .or_else(|| event.payment_ref.clone()),
        ..current.clone()
    };

    if !(further_refund || forward) {
        let outcome = if target == current.status && !target.is_refund() {
            // Already there: processed, no effects.
            Outcome::Processed
        } else {
            // Backwards, or a refund event that reports no more refunded money than recorded.
            Outcome::Stale
        };
        return Decision::Keep { next, outcome };
    }

    let mut outcome = Outcome::Processed;
    next.status = target;
    if reversal {
        // Not cancelled: the customer paid and the provider took it back, which an operator
        // has to look at (sekali orders set-status); no email tells the customer either way.
        next.status = OrderStatus::NeedsReview;
        outcome = Outcome::Reversed;
    } else if target == OrderStatus::Paid {
        // The payment that pays the order is the one it records, not the first attempt seen
        // (an expired virtual account before the transfer that paid): a reversal must name it.
        if let Some(reference) = &event.payment_ref {
            next.payment_ref = Some(reference.clone());
        }
        next.paid_amount = change.paid_amount.or(change.amount);
        next.paid_currency = change.currency.clone().or_else(|| current.currency.clone());
        if current.from_api && payment_mismatch(current, change) {
            // Do not mark it paid: an operator has to look (sekali orders set-status).
            next.status = OrderStatus::NeedsReview;
            outcome = Outcome::AmountMismatch;
        }
    }
    if let Some(reported) = change.refunded_amount {
        next.refunded_amount = next.refunded_amount.max(reported);
    }
    // The newest address wins for the notice this change sends, but for the shop's own: an API
    // order created with an address keeps it (the payer's stays in `payer_email`).
    let shops_own = current.from_api && current.customer_email.is_some();
    if email.is_some() && !shops_own {
        next.customer_email = email;
    }
    Decision::Move {
        from: current.status,
        next,
        outcome,
    }
}

/// True when `event`, which reports a reversal, is for the payment that paid `order`. A
/// provider keeps one order id across a customer's attempts (Midtrans), so a deny of another
/// attempt, arriving late, takes nothing back; a reversal that names no payment is not the
/// paying one's. A Midtrans order paid before sekali recorded its paying transaction
/// (`payment_intent_id` NULL) names none: nothing tells the attempts apart, and the reversal
/// stands, because an operator's look at an order still paid costs less than a reversal missed.
fn reverses_the_paying_transaction(order: &OrderState, event: &NormalizedEvent) -> bool {
    match &order.payment_ref {
        Some(paid_by) => event.payment_ref.as_deref() == Some(paid_by.as_str()),
        None => true,
    }
}

/// True when a payment's amount or currency differs from what the order asked for (currencies
/// compare case-insensitively: Stripe sends `idr`, Midtrans `IDR`).
fn payment_mismatch(order: &OrderState, change: &StatusChange) -> bool {
    let amount_differs =
        matches!((order.amount, change.paid_amount), (Some(want), Some(paid)) if want != paid);
    let currency_differs = matches!(
        (&order.currency, &change.currency),
        (Some(want), Some(paid)) if !want.eq_ignore_ascii_case(paid)
    );
    amount_differs || currency_differs
}

#[cfg(test)]
mod tests {
    use super::OrderStatus::*;
    use super::*;
    use crate::domain::OrderRef;

    fn event(provider: &str) -> NormalizedEvent {
        NormalizedEvent {
            provider: ProviderName::new(provider).unwrap(),
            event_id: "evt_1".into(),
            event_type: "test".into(),
            order_ref: OrderRef::OrderId("ord_1".into()),
            payment_ref: None,
            change: None,
            legacy_event_id: None,
            detail: None,
            retention: std::time::Duration::from_secs(60),
        }
    }

    fn change(target: OrderStatus) -> StatusChange {
        StatusChange {
            target,
            amount: Some(1500),
            exponent: Some(2),
            paid_amount: None,
            refunded_amount: None,
            currency: Some("usd".into()),
            customer_email: None,
            reverses_payment: false,
        }
    }

    fn order(status: OrderStatus) -> OrderState {
        OrderState {
            provider: ProviderName::new("stripe").unwrap(),
            exponent: Some(2),
            status,
            from_api: false,
            amount: Some(1500),
            refunded_amount: 0,
            currency: Some("usd".into()),
            customer_email: None,
            payer_email: None,
            payment_ref: None,
            paid_amount: None,
            paid_currency: None,
        }
    }

    fn decided(current: Option<&OrderState>, change: &StatusChange) -> (Outcome, OrderStatus) {
        let decision = decide(current, &event("stripe"), change);
        let status = match &decision {
            Decision::Create { state } => state.status,
            Decision::Move { next, .. } | Decision::Keep { next, .. } => next.status,
        };
        (decision.outcome(), status)
    }

    /// Every arrow of the state machine is a move; its reverse is stale.
    #[test]
    fn every_arrow_moves_forward_and_every_reverse_is_stale() {
        let arrows = [
            (Pending, Paid),
            (Pending, Failed),
            (Pending, Cancelled),
            (Pending, Expired),
            (Failed, Paid),
            (Failed, Cancelled),
            (Failed, Expired),
            (Expired, Paid),
            (Paid, PartiallyRefunded),
            (Paid, Refunded),
            (Paid, Disputed),
            (PartiallyRefunded, Refunded),
            (PartiallyRefunded, Disputed),
        ];
        for (from, to) in arrows {
            let mut c = change(to);
            if to.is_refund() {
                c.refunded_amount = Some(if to == Refunded { 1500 } else { 500 });
            }
            assert_eq!(
                decided(Some(&order(from)), &c),
                (Outcome::Processed, to),
                "{from} -> {to}"
            );
            let mut back = order(to);
            back.refunded_amount = c.refunded_amount.unwrap_or(0);
            assert_eq!(
                decided(Some(&back), &change(from)),
                (Outcome::Stale, to),
                "{to} -> {from}"
            );
        }
    }

    /// Every pair of statuses, as a table: the move is made exactly when the target is reachable
    /// along the arrows; otherwise the same status is processed without a move and any other is
    /// stale. No event moves an order backwards, out of a final status, or out of review.
    #[test]
    fn every_pair_of_statuses_moves_only_along_the_arrows() {
        use OrderStatus::*;
        #[rustfmt::skip]
        let table: [(OrderStatus, &[OrderStatus]); 9] = [
            (Pending, &[Paid, Failed, Cancelled, Expired, NeedsReview, PartiallyRefunded, Refunded, Disputed]),
            (Failed, &[Paid, Cancelled, Expired, NeedsReview, PartiallyRefunded, Refunded, Disputed]),
            (Expired, &[Paid, NeedsReview, PartiallyRefunded, Refunded, Disputed]),
            (Paid, &[PartiallyRefunded, Refunded, Disputed]),
            (PartiallyRefunded, &[Refunded, Disputed]),
            (Cancelled, &[]),
            (Refunded, &[]),
            (Disputed, &[]),
            (NeedsReview, &[]),
        ];
        for (from, reachable) in table {
            for to in OrderStatus::ALL {
                let mut c = change(to);
                if to.is_refund() {
                    c.refunded_amount = Some(if to == Refunded { 1500 } else { 500 });
                }
                // A refund status already holds its refund: the same report again adds none.
                let mut current = order(from);
                if from.is_refund() {
                    current.refunded_amount = if from == Refunded { 1500 } else { 500 };
                }
                let expected = if reachable.contains(&to) {
                    (Outcome::Processed, to)
                } else if to == from && !to.is_refund() {
                    (Outcome::Processed, from)
                } else {
                    (Outcome::Stale, from)
                };
                assert_eq!(decided(Some(&current), &c), expected, "{from} -> {to}");
            }
        }
    }

    #[test]
    fn an_order_seen_first_is_created_in_the_reported_state() {
        let mut c = change(Paid);
        c.paid_amount = Some(1500);
        let decision = decide(None, &event("midtrans"), &c);
        let Decision::Create { state } = decision else {
            panic!("{decision:?}")
        };
        assert_eq!(state.status, Paid);
        assert_eq!(state.provider, "midtrans");
        assert_eq!(
            (state.paid_amount, state.paid_currency.as_deref()),
            (Some(1500), Some("usd"))
        );
    }

    #[test]
    fn reaching_the_same_status_again_is_processed_without_a_move() {
        let decision = decide(Some(&order(Paid)), &event("stripe"), &change(Paid));
        assert!(
            matches!(
                decision,
                Decision::Keep {
                    outcome: Outcome::Processed,
                    ..
                }
            ),
            "{decision:?}"
        );
    }

    #[test]
    fn refunds_only_grow() {
        let mut partly = order(PartiallyRefunded);
        partly.refunded_amount = 500;
        let mut more = change(PartiallyRefunded);
        more.refunded_amount = Some(700);
        let decision = decide(Some(&partly), &event("stripe"), &more);
        let Decision::Move {
            next,
            outcome,
            from,
        } = decision
        else {
            panic!("{decision:?}")
        };
        assert_eq!(
            (from, next.status, next.refunded_amount, outcome),
            (
                PartiallyRefunded,
                PartiallyRefunded,
                700,
                Outcome::Processed
            )
        );
        let mut less = change(PartiallyRefunded);
        less.refunded_amount = Some(300);
        assert_eq!(
            decided(Some(&partly), &less),
            (Outcome::Stale, PartiallyRefunded)
        );
        let mut same = change(PartiallyRefunded);
        same.refunded_amount = Some(500);
        assert_eq!(
            decided(Some(&partly), &same),
            (Outcome::Stale, PartiallyRefunded)
        );
        // A full refund reporting less than already refunded comes from an older event.
        let mut older_full = change(Refunded);
        older_full.refunded_amount = Some(400);
        assert_eq!(
            decided(Some(&partly), &older_full),
            (Outcome::Stale, PartiallyRefunded)
        );
    }

    #[test]
    fn a_payment_that_does_not_match_an_api_order_needs_review_and_keeps_what_was_paid() {
        let mut api_order = order(Pending);
        api_order.from_api = true;
        let mut paid_less = change(Paid);
        paid_less.paid_amount = Some(1000);
        let decision = decide(Some(&api_order), &event("stripe"), &paid_less);
        let Decision::Move { next, outcome, .. } = decision else {
            panic!("{decision:?}")
        };
        assert_eq!(
            (next.status, outcome),
            (NeedsReview, Outcome::AmountMismatch)
        );
        assert_eq!(next.paid_amount, Some(1000));
        let mut other_currency = change(Paid);
        other_currency.paid_amount = Some(1500);
        other_currency.currency = Some("eur".into());
        assert_eq!(
            decided(Some(&api_order), &other_currency),
            (Outcome::AmountMismatch, NeedsReview)
        );
        let mut matching = change(Paid);
        matching.paid_amount = Some(1500);
        matching.currency = Some("USD".into());
        assert_eq!(
            decided(Some(&api_order), &matching),
            (Outcome::Processed, Paid)
        );
        // A webhook order has nothing of the shop's own to match.
        assert_eq!(
            decided(Some(&order(Pending)), &paid_less),
            (Outcome::Processed, Paid)
        );
    }

    #[test]
    fn a_reversal_of_a_paid_order_needs_review_and_carries_no_notice() {
        let mut deny = change(Cancelled);
        deny.reverses_payment = true;
        let mut paid = order(Paid);
        paid.payment_ref = Some("tx-1".into());
        let mut of_the_payment = event("midtrans");
        of_the_payment.payment_ref = Some("tx-1".into());
        let decision = decide(Some(&paid), &of_the_payment, &deny);
        let Decision::Move { next, outcome, .. } = &decision else {
            panic!("{decision:?}")
        };
        assert_eq!((next.status, *outcome), (NeedsReview, Outcome::Reversed));
        assert_eq!(next.status.notice(), None);
        // Before the payment, a deny is a plain cancellation; after a refund, it is stale.
        assert_eq!(
            decided(Some(&order(Pending)), &deny),
            (Outcome::Processed, Cancelled)
        );
        assert_eq!(
            decided(Some(&order(Refunded)), &deny),
            (Outcome::Stale, Refunded)
        );
        // A cancellation that is not a reversal does not move a paid order.
        assert_eq!(
            decided(Some(&order(Paid)), &change(Cancelled)),
            (Outcome::Stale, Paid)
        );
    }

    /// A deny or cancel reverses a paid order only when it is for the transaction that paid
    /// it: Midtrans keeps one order id across a customer's attempts, and a late deny of another
    /// attempt (a card declined before the bank transfer that paid) takes nothing back.
    #[test]
    fn only_a_reversal_of_the_paying_transaction_moves_a_paid_order_to_review() {
        // (order status, transaction recorded on the order, the deny's transaction) -> result
        #[rustfmt::skip]
        let table = [
            (Paid, Some("tx-1"), Some("tx-1"), (Outcome::Reversed, NeedsReview)),
            (Paid, Some("tx-1"), Some("tx-2"), (Outcome::Stale, Paid)),
            // A deny that names no transaction cannot be the paying one's.
            (Paid, Some("tx-1"), None, (Outcome::Stale, Paid)),
            // An order paid before sekali recorded Midtrans transactions: nothing tells the two
            // apart, and an operator's look costs less than a reversal missed.
            (Paid, None, Some("tx-2"), (Outcome::Reversed, NeedsReview)),
            (Paid, None, None, (Outcome::Reversed, NeedsReview)),
            // Before a payment, a deny of any attempt is a plain cancellation.
            (Pending, Some("tx-1"), Some("tx-2"), (Outcome::Processed, Cancelled)),
            // After a refund, or once in review, nothing is reversed again.
            (Refunded, Some("tx-1"), Some("tx-1"), (Outcome::Stale, Refunded)),
            (PartiallyRefunded, Some("tx-1"), Some("tx-1"), (Outcome::Stale, PartiallyRefunded)),
            (NeedsReview, Some("tx-1"), Some("tx-1"), (Outcome::Stale, NeedsReview)),
        ];
        for (status, paid_by, denied, expected) in table {
            let mut current = order(status);
            current.payment_ref = paid_by.map(str::to_owned);
            if status.is_refund() {
                current.refunded_amount = if status == Refunded { 1500 } else { 500 };
            }
            let mut deny = change(Cancelled);
            deny.reverses_payment = true;
            let mut event = event("midtrans");
            event.payment_ref = denied.map(str::to_owned);
            let decision = decide(Some(&current), &event, &deny);
            let (outcome, next) = match &decision {
                Decision::Move { outcome, next, .. } | Decision::Keep { outcome, next } => {
                    (*outcome, next)
                }
                Decision::Create { .. } => panic!("{decision:?}"),
            };
            assert_eq!(
                (outcome, next.status),
                expected,
                "{status} paid by {paid_by:?}, deny of {denied:?}"
            );
            if status == Paid && paid_by.is_some() {
                // The transaction that paid stays the one recorded, whatever was denied.
                assert_eq!(next.payment_ref.as_deref(), paid_by, "{denied:?}");
            }
        }
    }

    /// The transaction recorded on an order is the one that paid it, not the first attempt
    /// seen: an order whose first attempt expired and whose second paid is reversed by a deny of
    /// the second.
    #[test]
    fn the_payment_that_pays_an_order_is_the_one_it_records() {
        let mut paying = event("midtrans");
        paying.payment_ref = Some("tx-2".into());
        for from in [Pending, Failed, Expired] {
            let mut current = order(from);
            current.payment_ref = Some("tx-1".into());
            let decision = decide(Some(&current), &paying, &change(Paid));
            let Decision::Move { next, outcome, .. } = &decision else {
                panic!("{decision:?}")
            };
            assert_eq!(
                (*outcome, next.status),
                (Outcome::Processed, Paid),
                "{from}"
            );
            assert_eq!(next.payment_ref.as_deref(), Some("tx-2"), "{from}");

            let mut deny = change(Cancelled);
            deny.reverses_payment = true;
            assert_eq!(
                decide(Some(next), &paying, &deny).outcome(),
                Outcome::Reversed,
                "{from}"
            );
        }
        // A payment that does not match an API order records its transaction too: an operator
        // who settles the order leaves it reversible by that transaction.
        let mut api_order = order(Pending);
        api_order.from_api = true;
        let mut paid_less = change(Paid);
        paid_less.paid_amount = Some(1000);
        let decision = decide(Some(&api_order), &paying, &paid_less);
        let Decision::Move { next, outcome, .. } = &decision else {
            panic!("{decision:?}")
        };
        assert_eq!(*outcome, Outcome::AmountMismatch);
        assert_eq!(next.payment_ref.as_deref(), Some("tx-2"));
        // A payment event that names no payment keeps the one recorded.
        let mut current = order(Pending);
        current.payment_ref = Some("tx-1".into());
        let decision = decide(Some(&current), &event("stripe"), &change(Paid));
        let Decision::Move { next, .. } = &decision else {
            panic!("{decision:?}")
        };
        assert_eq!(next.payment_ref.as_deref(), Some("tx-1"));
        // And a move other than to paid keeps the first payment seen.
        let mut other = event("stripe");
        other.payment_ref = Some("pi_2".into());
        let decision = decide(Some(&current), &other, &change(Failed));
        let Decision::Move { next, .. } = &decision else {
            panic!("{decision:?}")
        };
        assert_eq!(next.payment_ref.as_deref(), Some("tx-1"));
    }

    /// The shop's address (an API order created with one) is where its emails go, whatever the
    /// provider reports of the payer; a webhook order's goes to the newest payer's address.
    #[test]
    fn the_shops_own_address_is_kept_and_the_payers_is_the_newest_reported() {
        let mut reported = change(Paid);
        reported.customer_email = Some(EmailAddress::parse("payer@bank.example").unwrap());
        let mut api_order = order(Pending);
        api_order.from_api = true;
        api_order.customer_email = Some("buyer@shop.example".into());
        let Decision::Move { next, .. } = decide(Some(&api_order), &event("stripe"), &reported)
        else {
            panic!()
        };
        assert_eq!(
            (next.customer_email.as_deref(), next.payer_email.as_deref()),
            (Some("buyer@shop.example"), Some("payer@bank.example"))
        );
        // Without an address of its own, an API order takes the payer's.
        api_order.customer_email = None;
        let Decision::Move { next, .. } = decide(Some(&api_order), &event("stripe"), &reported)
        else {
            panic!()
        };
        assert_eq!(next.customer_email.as_deref(), Some("payer@bank.example"));
        // A webhook order's address is the newest payer's.
        let mut webhook_order = order(Pending);
        webhook_order.customer_email = Some("old@bank.example".into());
        let Decision::Move { next, .. } = decide(Some(&webhook_order), &event("stripe"), &reported)
        else {
            panic!()
        };
        assert_eq!(next.customer_email.as_deref(), Some("payer@bank.example"));
    }

    #[test]
    fn details_the_order_lacks_are_filled_in_even_by_a_stale_event() {
        let mut bare = order(Paid);
        bare.amount = None;
        bare.currency = None;
        let mut late = change(Pending);
        late.customer_email = Some(EmailAddress::parse("sari@toko.example").unwrap());
        let decision = decide(Some(&bare), &event("stripe"), &late);
        let Decision::Keep { next, outcome } = decision else {
            panic!("{decision:?}")
        };
        assert_eq!(outcome, Outcome::Stale);
        assert_eq!(
            (
                next.amount,
                next.currency.as_deref(),
                next.customer_email.as_deref()
            ),
            (Some(1500), Some("usd"), Some("sari@toko.example"))
        );
    }
}
