//! Provider-independent types: what an event means once its provider's format is gone.

pub mod decision;
pub mod email;
pub mod event;
pub mod ledger;
pub mod money;
pub mod notice;
pub mod order;
pub mod text;

pub use decision::{decide, Decision, OrderState, Outcome};
pub use email::EmailAddress;
pub use event::{NormalizedEvent, OrderRef, PaymentReport, ProviderName};
pub use notice::{notice_key, QueuedNotice};
pub use order::{Notice, OrderStatus};

/// Lower-case hex of a digest. `hex::encode` builds its `String` one `char` at a time; this
/// fills a buffer with `hex::encode_to_slice` (a table lookup per byte), several times faster.
/// It runs for every delivery: the outbox key, and the load generator's signatures.
pub fn hex_lower(bytes: &[u8]) -> String {
    let mut out = vec![0u8; bytes.len() * 2];
    hex::encode_to_slice(bytes, &mut out).expect("the buffer holds two digits per byte");
    String::from_utf8(out).expect("hex digits are ASCII")
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_lower_matches_hex_encode() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(super::hex_lower(&bytes), hex::encode(&bytes));
        assert_eq!(super::hex_lower(&[]), "");
    }
}
