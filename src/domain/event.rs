//! The normalised form of a webhook event, shared by both providers.

use std::fmt;
use std::str::FromStr;

use super::{EmailAddress, OrderStatus};

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

impl Provider {
    /// Decimals of this provider's amounts in `currency`: Stripe's own table for Stripe, ISO
    /// 4217 for Midtrans (whose `gross_amount` text sekali reads into ISO minor units).
    pub fn amount_exponent(self, currency: &str) -> u32 {
        match self {
            Provider::Stripe => super::money::stripe_exponent(currency),
            Provider::Midtrans => super::money::iso_exponent(currency),
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
    /// Only a payment's id (a Stripe PaymentIntent, or for a charge of the Charges API the
    /// charge); the order is whichever one recorded it. `park_if_unlinked` is set for charges and
    /// disputes, which may arrive before the event that links the payment to its order and must
    /// then wait for it rather than be dropped.
    Payment {
        reference: String,
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
    /// Decimals of the minor units of this event's amounts, by its provider's rules (Stripe's
    /// table, ISO 4217 for the others); `None` when the event names no currency.
    pub exponent: Option<u32>,
    /// What the payment itself says was paid, in minor units (Stripe `amount_received`,
    /// Checkout `amount_total`, Midtrans `gross_amount`); checked against an API order's amount
    /// on a move to paid.
    pub paid_amount: Option<i64>,
    /// Cumulative refunded amount in minor units (refund events only).
    pub refunded_amount: Option<i64>,
    pub currency: Option<String>,
    /// One address, parsed at the edge; an address that is not exactly one is dropped there.
    pub customer_email: Option<EmailAddress>,
    /// The provider reports that a payment it had settled was reversed (Midtrans `deny` or
    /// `cancel` after `settlement` or `capture`): an order already paid goes to `needs_review`
    /// rather than being treated as stale.
    pub reverses_payment: bool,
}

/// One verified delivery, reduced to what the store needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NormalizedEvent {
    pub provider: Provider,
    /// The provider's event id (`evt_…`), or the derived Midtrans id.
    pub event_id: String,
    pub event_type: String,
    pub order_ref: OrderRef,
    /// The payment this event ties to its order (Stripe only: a PaymentIntent, or a charge of
    /// the Charges API), so that later charges and disputes can find the order through it.
    pub payment_ref: Option<String>,
    /// `None` for event types sekali does not act on: they are recorded as `ignored`.
    pub change: Option<StatusChange>,
    /// The id an older sekali derived for this same delivery, when it differs from `event_id`
    /// (Midtrans ids changed form): a live claim under it is a duplicate too.
    pub legacy_event_id: Option<String>,
    /// Said in the answer to the sender, for an event acknowledged but not acted on for a reason
    /// the shop can fix (a Stripe thin event).
    pub detail: Option<&'static str>,
}
