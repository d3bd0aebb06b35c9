//! `cargo bench --bench email`: what one customer email costs the relay, phase by phase, on one
//! core: rendering the templates (minijinja, the amount by ICU4X's CLDR data), building the
//! RFC 5322 message (lettre), and writing a batch of `.eml` files durably (unnamed files, one
//! syncfs or an fsync each, names, one directory fsync): one batch after another, and as the
//! relay does it, each batch written while the one before is synced and named.
//! SEKALI_BENCH_EMAILS (default 20000) emails, in batches of SEKALI_BENCH_FILE_BATCH (default
//! the relay's in `serve`).

use std::time::{Duration, Instant};

use sekali::jobs::relay::FILE_BATCH;
use sekali::mail::eml::{write_eml_batch, write_unsynced, DirSync, Unsynced};
use sekali::mail::transport::Messages;
use sekali::mail::{render, RenderedEmail, Sender};
use sekali::store::ClaimedEmail;

fn claimed(i: usize) -> ClaimedEmail {
    let (amount, currency) = match i % 3 {
        0 => (15_000_000, "IDR"),
        1 => (2500, "usd"),
        _ => (5000, "jpy"),
    };
    ClaimedEmail {
        id: i as i64,
        order_id: format!("ord_bench_{i:06}"),
        recipient: Some(format!("customer{i}@example.com")),
        template: ["receipt", "refund_notice", "payment_failed"][i % 3].into(),
        params: format!(
            r#"{{"amount":{amount},"currency":"{currency}","event_id":"evt_{i}","exponent":{},"order_id":"ord_bench_{i:06}","provider":"stripe","refunded_amount":1000,"refunded_currency":"{currency}","status":"paid"}}"#,
            if currency == "jpy" { 0 } else { 2 }
        ),
        idempotency_key: format!("{:064x}", i),
        attempts: 0,
        first_tried_ms: None,
        locale: None,
    }
}

fn per_email(label: &str, elapsed: Duration, n: usize) {
    println!(
        "{label:<56} {:>8.1} µs per email   {:>9.0} emails/s",
        elapsed.as_secs_f64() * 1e6 / n as f64,
        n as f64 / elapsed.as_secs_f64()
    );
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let n: usize = std::env::var("SEKALI_BENCH_EMAILS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let rows: Vec<ClaimedEmail> = (0..n).map(claimed).collect();

    let started = Instant::now();
    let sender = Sender::new("Toko Sari <shop@toko.example>");
    let rendered: Vec<RenderedEmail> = rows
        .iter()
        .map(|row| render(row, &sender).unwrap())
        .collect();
    per_email(
        "render (text + html, amount, subject)",
        started.elapsed(),
        n,
    );

    let started = Instant::now();
    let mut messages = Messages::default();
    let files: Vec<(String, Vec<u8>)> = rendered
        .iter()
        .map(|email| {
            (
                email.idempotency_key.clone(),
                messages.bytes(email).unwrap(),
            )
        })
        .collect();
    per_email("build the message (lettre, MIME)", started.elapsed(), n);
    let bytes: usize = files.iter().map(|(_, b)| b.len()).sum();
    println!(
        "{:<56} {:>8.0} bytes per email",
        "message size",
        bytes as f64 / n as f64
    );

    let batch_size: usize = std::env::var("SEKALI_BENCH_FILE_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(FILE_BATCH);
    yardstick(n);
    for sync in [DirSync::FileSystem, DirSync::EachFile] {
        for pipelined in [false, true] {
            // Kept, not deleted: on ext4 without a journal, deleting 20,000 files slows whatever
            // creates files next (here, the next configuration; see make_work_dir in
            // benches/lib.sh).
            let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))
                .unwrap()
                .keep();
            // The benchmark's own sync choice, whatever the file system: the line says which.
            let started = Instant::now();
            if pipelined {
                write_pipelined(&dir, &files, batch_size, sync);
            } else {
                for batch in files.chunks(batch_size) {
                    for result in write_eml_batch(&dir, batch, sync) {
                        result.unwrap();
                    }
                }
            }
            per_email(
                &format!(
                    "write .eml durably, {}{}",
                    sync.as_str(),
                    if pipelined { ", pipelined" } else { "" }
                ),
                started.elapsed(),
                n,
            );
        }
        println!(
            "{:<56} {}",
            "  (the mail directory's file system gets)",
            DirSync::for_dir(env!("CARGO_TARGET_TMPDIR").as_ref()).as_str()
        );
    }
}

/// As the relay writes files: each batch is written on this thread while the one before is
/// synced and named on another.
fn write_pipelined(
    dir: &std::path::Path,
    files: &[(String, Vec<u8>)],
    batch: usize,
    sync: DirSync,
) {
    let (to_name, written) = std::sync::mpsc::sync_channel::<Unsynced>(1);
    std::thread::scope(|scope| {
        scope.spawn(move || {
            for unsynced in written {
                for result in unsynced.sync_and_name() {
                    result.unwrap();
                }
            }
        });
        for chunk in files.chunks(batch) {
            to_name
                .send(write_unsynced(dir, chunk, sync).unwrap())
                .unwrap();
        }
        drop(to_name);
    });
}

/// The file system's own pace, as issue 16 measured it: 3 KB files created under their final
/// names, with an fsync each, then with one syncfs per 256. Not crash-safe (a power cut can
/// leave an empty or partial file under a final name, and a reader can see one being written),
/// so not what the relay does; a yardstick for it, measured on the same disk in the same run.
fn yardstick(n: usize) {
    use std::io::Write;
    let data = vec![b'x'; 3000];
    for each_file in [true, false] {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap()
            .keep();
        let handle = std::fs::File::open(&dir).unwrap();
        // Fewer files with an fsync each: at a few thousand a second, n would take minutes.
        let files = if each_file { n.min(5_000) } else { n };
        let started = Instant::now();
        for i in 0..files {
            let mut file = std::fs::File::create(dir.join(format!("{i:08}.eml"))).unwrap();
            file.write_all(&data).unwrap();
            if each_file {
                file.sync_data().unwrap();
            } else if i % 256 == 255 {
                rustix::fs::syncfs(&handle).unwrap();
            }
        }
        rustix::fs::syncfs(&handle).unwrap();
        per_email(
            if each_file {
                "yardstick: 3 KB files, an fsync each"
            } else {
                "yardstick: 3 KB files, one syncfs per 256"
            },
            started.elapsed(),
            files,
        );
    }
}
