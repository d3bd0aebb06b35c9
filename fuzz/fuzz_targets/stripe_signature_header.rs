//! `Stripe-Signature` parsing and verification on arbitrary input.
//!
//! The input is split at the first NUL byte: the part before it is the header (it must be UTF-8,
//! as actix hands the handler a `&str`), the part after it the body. Neither function may panic,
//! and a header the fuzzer made up must never verify against the fixed secret.
#![no_main]

use libfuzzer_sys::fuzz_target;
use secrecy::SecretString;
use sekali::providers::stripe::{
    parse_signature_header, verify_stripe_signature, DEFAULT_TOLERANCE_SECS,
};

const SECRET: &str = "whsec_fuzz_fixed_secret";
const NOW: i64 = 1_732_870_012;

fuzz_target!(|data: &[u8]| {
    let (header, body) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let Ok(header) = std::str::from_utf8(header) else {
        return;
    };

    if let Ok(parsed) = parse_signature_header(header) {
        assert!(!parsed.v1.is_empty(), "a parsed header has at least one v1");
    }

    let secrets = [SecretString::from(SECRET.to_owned())];
    let verdict =
        verify_stripe_signature(Some(header), body, &secrets, NOW, DEFAULT_TOLERANCE_SECS);
    assert!(verdict.is_err(), "a made-up header verified: {header:?}");
    let _ = verify_stripe_signature(Some(header), body, &[], NOW, DEFAULT_TOLERANCE_SECS);
});
