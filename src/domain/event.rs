//! The normalised form of a webhook event, shared by both providers.

use std::fmt;
use std::str::FromStr;

use super::OrderStatus;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    Stripe,
    Midtrans,
}

impl Provider {
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Stripe => "stripe",
            Provider::Midtrans => "midtrans",
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Provider {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "stripe" => Ok(Provider::Stripe),
            "midtrans" => Ok(Provider::Midtrans),
            other => Err(format!(
                "unknown provider `{other}` (expected stripe or midtrans)"
            )),
        }
    }
}

/// How an event names the order it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderRef {
    /// The shop's own order id (Stripe `metadata.order_id` / `client_reference_id`, Midtrans
    /// `order_id`).
    OrderId(String),
    /// Only a Stripe PaymentIntent id; the order is whichever one recorded it. `park_if_unlinked`
    /// is set for charges and disputes, which may arrive before the event that links the
    /// PaymentIntent to its order and must then wait for it rather than be dropped.
    PaymentIntent {
        payment_intent_id: String,
        park_if_unlinked: bool,
    },
    /// Nothing to act on.
    None,
}

/// What an event says about its order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusChange {
    pub target: OrderStatus,
    /// The order's amount in minor units, when the event states it.
    pub amount: Option<i64>,
    /// What the payment itself says was paid, in minor units (Stripe `amount_received`,
    /// Checkout `amount_total`, Midtrans `gross_amount`); checked against an API order's amount
    /// on a move to paid.
    pub paid_amount: Option<i64>,
    /// Cumulative refunded amount in minor units (refund events only).
    pub refunded_amount: Option<i64>,
    pub currency: Option<String>,
    pub customer_email: Option<String>,
}

/// One verified delivery, reduced to what the store needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NormalizedEvent {
    pub provider: Provider,
    /// The provider's event id (`evt_…`), or the derived Midtrans id.
    pub event_id: String,
    pub event_type: String,
    pub order_ref: OrderRef,
    /// A PaymentIntent this event ties to its order (Stripe only).
    pub payment_intent_id: Option<String>,
    /// `None` for event types sekali does not act on: they are recorded as `ignored`.
    pub change: Option<StatusChange>,
}
