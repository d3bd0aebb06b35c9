//! The email an order's change queues: which template, what it shows, and the key that makes it
//! one email however many events announce the same change. Decided here, persisted by the store
//! as it is: the key is the email's identity downstream (its Message-ID, and the HTTP email API's
//! Idempotency-Key), so every storage engine must produce exactly the same one.

use sha2::{Digest, Sha256};

use super::{Notice, OrderState, OrderStatus};

/// An email to queue for an order, in the form the outbox stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedNotice {
    pub template: &'static str,
    /// `email_outbox.params`: what the templates render, as JSON.
    pub params: String,
    /// [`notice_key`] of the change.
    pub key: String,
}

/// `email_outbox.params`. Serialised straight from borrowed fields (no intermediate
/// `serde_json::Value`): this runs for most deliveries. The fields are in alphabetical order, the
/// order the rows have always had.
#[derive(serde::Serialize)]
struct NoticeParams<'a> {
    /// The amount the email shows: for a receipt what was paid, else the order's.
    amount: Option<i64>,
    currency: Option<&'a str>,
    event_id: &'a str,
    /// Decimals of `amount`, `refund_amount` and `refunded_amount`; absent for an order older
    /// than schema version 5, whose renderer asks the provider.
    #[serde(skip_serializing_if = "Option::is_none")]
    exponent: Option<u32>,
    order_id: &'a str,
    provider: &'a str,
    /// A refund notice's money given back this time (absent on rows older than the ledger, whose
    /// notice showed `refunded_amount`).
    #[serde(skip_serializing_if = "Option::is_none")]
    refund_amount: Option<i64>,
    /// Money given back in all.
    refunded_amount: i64,
    /// The currency of `refunded_amount` (the order's).
    refunded_currency: Option<&'a str>,
    status: &'a str,
}

/// The notice `order` (just changed by `event_id` of `provider`, or by `api`/`operator`) carries
/// for its status, if it has one: a receipt for what was paid, a refund notice for what was given
/// back, a payment-failed notice. In the order's own units.
pub fn for_status(
    order_id: &str,
    order: &OrderState,
    provider: &str,
    event_id: &str,
) -> Option<QueuedNotice> {
    let notice = order.status.notice()?;
    // A receipt says what the customer paid: after a mismatch that an operator settled, that is
    // not the order's amount.
    let (amount, currency) = match (notice, order.paid_amount) {
        (Notice::Receipt, Some(paid)) => (
            Some(paid),
            order.paid_currency.as_deref().or(order.currency.as_deref()),
        ),
        _ => (order.amount, order.currency.as_deref()),
    };
    Some(queued(
        notice,
        order_id,
        order.status,
        NoticeParams {
            order_id,
            status: order.status.as_str(),
            amount,
            refund_amount: None,
            refunded_amount: order.refunded_amount,
            exponent: order.exponent,
            currency,
            refunded_currency: order.currency.as_deref(),
            provider,
            event_id,
        },
    ))
}

/// The receipt for money an order's payments took (`captured`, ISO 4217 minor units of
/// `currency`): one per order, whatever its status, as long as the order has money.
pub fn receipt(
    order_id: &str,
    captured: i64,
    currency: Option<&str>,
    provider: &str,
    event_id: &str,
) -> Option<QueuedNotice> {
    Some(queued(
        Notice::Receipt,
        order_id,
        OrderStatus::Paid,
        NoticeParams {
            order_id,
            // A receipt is for a payment, whatever else the order's status says (a payment in
            // review took the money all the same).
            status: OrderStatus::Paid.as_str(),
            amount: Some(captured),
            refund_amount: None,
            refunded_amount: 0,
            exponent: currency.map(super::money::iso_exponent),
            currency,
            refunded_currency: currency,
            provider,
            event_id,
        },
    ))
}

/// The refund notice for `returned` more money given back, `total` in all (ISO 4217 minor units
/// of `currency`): one per total, so that each refund is told once.
pub fn refund(
    order_id: &str,
    order: &OrderState,
    returned: i64,
    total: i64,
    currency: Option<&str>,
    provider: &str,
    event_id: &str,
) -> Option<QueuedNotice> {
    let status = if order.status == OrderStatus::Refunded {
        OrderStatus::Refunded
    } else {
        OrderStatus::PartiallyRefunded
    };
    Some(queued(
        Notice::RefundNotice,
        order_id,
        status,
        NoticeParams {
            order_id,
            status: status.as_str(),
            amount: order.paid_amount,
            refund_amount: Some(returned),
            refunded_amount: total,
            exponent: currency.map(super::money::iso_exponent),
            currency,
            refunded_currency: currency,
            provider,
            event_id,
        },
    ))
}

fn queued(
    notice: Notice,
    order_id: &str,
    status: OrderStatus,
    params: NoticeParams<'_>,
) -> QueuedNotice {
    let key_amount = if notice == Notice::Receipt {
        0
    } else {
        params.refunded_amount
    };
    QueuedNotice {
        template: notice.template(),
        params: serde_json::to_string(&params).expect("serialising plain fields cannot fail"),
        key: notice_key(order_id, notice.template(), status, key_amount),
    }
}

/// Hex SHA-256 over the order id, template, status and refunded amount: `[0-9a-f]{64}`, so it can
/// stand verbatim in a Message-ID or an HTTP header. The change itself, not the event that
/// announced it: two events announcing the same change queue one email.
pub fn notice_key(
    order_id: &str,
    template: &str,
    status: OrderStatus,
    refunded_amount: i64,
) -> String {
    let mut hasher = Sha256::new();
    for part in [
        order_id,
        template,
        status.as_str(),
        &refunded_amount.to_string(),
    ] {
        hasher.update(part.as_bytes());
        hasher.update([0x1f]); // unit separator: no part can run into the next
    }
    super::hex_lower(&hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ProviderName;

    fn order(status: OrderStatus) -> OrderState {
        OrderState {
            provider: ProviderName::new("stripe").unwrap(),
            exponent: Some(2),
            status,
            from_api: true,
            amount: Some(2500),
            refunded_amount: 0,
            currency: Some("usd".into()),
            customer_email: Some("sari@example.com".into()),
            payer_email: None,
            payment_ref: None,
            paid_amount: None,
            paid_currency: None,
            review: None,
            operator: None,
            acknowledged: Vec::new(),
            announced: 0,
        }
    }

    #[test]
    fn only_paid_failed_and_refund_statuses_carry_a_notice() {
        use OrderStatus::*;
        let with: Vec<_> = OrderStatus::ALL
            .into_iter()
            .filter(|s| for_status("o", &order(*s), "stripe", "evt").is_some())
            .collect();
        assert_eq!(with, [Paid, Failed, PartiallyRefunded, Refunded]);
    }

    /// The key is the email's identity downstream: its exact value is pinned, so no change
    /// (or a second engine) can make the same change a second email.
    #[test]
    fn the_key_is_the_change_not_the_event_and_its_value_is_stable() {
        let paid = order(OrderStatus::Paid);
        let a = for_status("ord_1", &paid, "stripe", "evt_a").unwrap();
        let b = for_status("ord_1", &paid, "stripe", "evt_b").unwrap();
        assert_eq!(a.key, b.key);
        assert_eq!(a.template, "receipt");
        assert_eq!(
            a.key,
            notice_key("ord_1", "receipt", OrderStatus::Paid, 0),
            "{a:?}"
        );
        let mut refunded = order(OrderStatus::PartiallyRefunded);
        refunded.refunded_amount = 500;
        let first = for_status("ord_1", &refunded, "stripe", "evt_c").unwrap();
        refunded.refunded_amount = 700;
        let second = for_status("ord_1", &refunded, "stripe", "evt_d").unwrap();
        assert_ne!(first.key, second.key, "a further refund is a further email");
        // No part runs into the next: ("ab", "c") and ("a", "bc") differ.
        assert_ne!(
            notice_key("ab", "c", OrderStatus::Paid, 0),
            notice_key("a", "bc", OrderStatus::Paid, 0)
        );
    }

    #[test]
    fn a_receipt_shows_what_was_paid_and_other_notices_the_orders_amount() {
        let mut paid = order(OrderStatus::Paid);
        paid.paid_amount = Some(2000);
        paid.paid_currency = Some("usd".into());
        let receipt = for_status("ord_1", &paid, "operator", "operator").unwrap();
        assert_eq!(
            receipt.params,
            r#"{"amount":2000,"currency":"usd","event_id":"operator","exponent":2,"order_id":"ord_1","provider":"operator","refunded_amount":0,"refunded_currency":"usd","status":"paid"}"#
        );
        let mut refunded = paid.clone();
        refunded.status = OrderStatus::Refunded;
        refunded.refunded_amount = 2500;
        let notice = for_status("ord_1", &refunded, "stripe", "evt_r").unwrap();
        assert!(
            notice.params.starts_with(r#"{"amount":2500,"#),
            "{}",
            notice.params
        );
    }

    /// The ledger's notices: a receipt for the money taken, once per order (its key is the
    /// operator's receipt's); a refund notice for the money given back this time and in all,
    /// keyed by the total, so each refund is told once.
    #[test]
    fn the_ledgers_receipt_and_refund_notice_carry_what_moved() {
        let paid = order(OrderStatus::Paid);
        let receipt = receipt("ord_1", 2500, Some("USD"), "stripe", "evt_1").unwrap();
        assert_eq!(
            receipt.key,
            for_status("ord_1", &paid, "op", "op").unwrap().key
        );
        assert_eq!(
            receipt.params,
            r#"{"amount":2500,"currency":"USD","event_id":"evt_1","exponent":2,"order_id":"ord_1","provider":"stripe","refunded_amount":0,"refunded_currency":"USD","status":"paid"}"#
        );
        let mut partly = paid.clone();
        partly.status = OrderStatus::PartiallyRefunded;
        partly.paid_amount = Some(2500);
        let first = refund("ord_1", &partly, 1000, 1000, Some("USD"), "stripe", "evt_2").unwrap();
        let second = refund("ord_1", &partly, 500, 1500, Some("USD"), "stripe", "evt_3").unwrap();
        assert_ne!(first.key, second.key);
        assert_eq!(
            first.key,
            notice_key(
                "ord_1",
                "refund_notice",
                OrderStatus::PartiallyRefunded,
                1000
            )
        );
        assert!(
            second
                .params
                .contains(r#""refund_amount":500,"refunded_amount":1500"#),
            "{}",
            second.params
        );
    }
}
