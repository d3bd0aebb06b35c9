//! Midtrans notification parsing, normalisation and `signature_key` verification on arbitrary
//! bytes. None of them may panic. A body the fuzzer made up must not verify unless it carries
//! the signature computed from its own fields (which the fuzzer cannot find by chance).
#![no_main]

use libfuzzer_sys::fuzz_target;
use secrecy::SecretString;
use sekali::providers::midtrans::{
    compute_signature_key, parse_notification, verify_midtrans_signature,
};

const SERVER_KEY: &str = "SB-Mid-server-fuzz-fixed-key";

fuzz_target!(|data: &[u8]| {
    let Ok(notification) = parse_notification(data) else {
        return;
    };
    let key = SecretString::from(SERVER_KEY.to_owned());
    let verdict = verify_midtrans_signature(&notification, &key);
    let expected = compute_signature_key(
        &notification.order_id,
        notification.status_code.as_text(),
        notification.gross_amount.as_text(),
        SERVER_KEY,
    );
    assert_eq!(
        verdict.is_ok(),
        notification.signature_key.eq_ignore_ascii_case(&expected),
        "verification disagrees with the recomputed signature_key"
    );

    let _ = notification.refunded_amount();
    let derived = notification.derived_event_id();
    let event = notification.normalise();
    assert_eq!(event.event_id, derived);
});
