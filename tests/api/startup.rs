//! What `sekali serve` says when it starts: warnings a first-time user needs, no empty fields,
//! and never a password that a configured URL carries.

use std::process::Command;

use crate::helpers::*;

/// Fails on the version that said nothing of the default sender.
#[test]
fn serve_warns_of_the_default_sender_and_not_of_the_shops_own() {
    let server = ServeProcess::start(&[("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)], "info");
    let (_, logs) = server.stop();
    assert_eq!(
        logs.matches("the customer emails' sender is the default sekali@localhost")
            .count(),
        1,
        "{logs}"
    );
    let configured = ServeProcess::start(
        &[
            ("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET),
            ("SEKALI_MAIL_FROM", "Toko Sari <orders@toko.example>"),
        ],
        "info",
    );
    let (_, logs) = configured.stop();
    assert!(!logs.contains("sender is the default"), "{logs}");
    // Without a relay, no email is sent from this process: nothing to warn of.
    let no_relay = ServeProcess::start_with(
        &[("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)],
        "info",
        &["--no-relay"],
    );
    let (_, logs) = no_relay.stop();
    assert!(!logs.contains("sender is the default"), "{logs}");
}

/// The fields of every line `serve` logs at startup and shutdown that have nothing after their
/// `=`.
fn empty_fields(logs: &str) -> Vec<String> {
    logs.lines()
        .flat_map(|line| {
            line.split_whitespace()
                .filter(|field| field.ends_with('=') && !field.starts_with('='))
                .map(|field| format!("{field} in {line}"))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Fails on the version whose listening line had `providers=` with nothing after it when no
/// provider had a word to say (Stripe alone), and whose relay line had `mail_dir=` for SMTP.
#[test]
fn serve_logs_no_empty_fields() {
    let smtp = ServeProcess::start(
        &[
            ("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET),
            ("SEKALI_SMTP_URL", "smtp://127.0.0.1:1"),
        ],
        "info",
    );
    let (_, logs) = smtp.stop();
    assert!(logs.contains("sekali is listening"), "{logs}");
    assert!(logs.contains("outbox relay started"), "{logs}");
    assert_eq!(empty_fields(&logs), Vec::<String>::new());
    // Midtrans has a word: the field is there with it.
    let with_midtrans = ServeProcess::start(PROVIDER_ENV, "info");
    let (_, logs) = with_midtrans.stop();
    assert!(
        logs.contains("providers=midtrans: status check off"),
        "{logs}"
    );
}

/// Fails on the version whose startup error echoed `SEKALI_MAIL_API_URL` whole, password
/// included.
#[test]
fn a_password_in_a_configured_url_is_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    let serve = |env: &[(&str, &str)]| {
        Command::new(sekali_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--db"])
            .arg(dir.path().join("s.db"))
            .arg("--mail-dir")
            .arg(dir.path().join("mail"))
            .env("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)
            .envs(env.iter().copied())
            .output()
            .unwrap()
    };
    let output = serve(&[
        ("SEKALI_MAIL_API_URL", "ftp://user:PASSW0RD@mail.example/x"),
        ("SEKALI_MAIL_API_KEY", "k"),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains(
            "SEKALI_MAIL_API_URL `ftp://***@mail.example/x` is not an http:// or https:// URL"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("PASSW0RD"), "{stderr}");

    let output = serve(&[
        ("MIDTRANS_SERVER_KEY", MIDTRANS_KEY),
        ("MIDTRANS_API_URL", "ftp://user:PASSW0RD@api.example"),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("`ftp://***@api.example`"), "{stderr}");
    assert!(!stderr.contains("PASSW0RD"), "{stderr}");

    // A URL that works is named in the listening line without its password too.
    let server = ServeProcess::start(
        &[
            ("MIDTRANS_SERVER_KEY", MIDTRANS_KEY),
            ("SEKALI_MIDTRANS_STATUS_CHECK", "on"),
            ("MIDTRANS_API_URL", "https://user:PASSW0RD@api.example"),
        ],
        "info",
    );
    let (_, logs) = server.stop();
    assert!(
        logs.contains("status check on, https://***@api.example"),
        "{logs}"
    );
    assert!(!logs.contains("PASSW0RD"), "{logs}");
}
